# cmake -DCOMMAND=<;-list> -DEXPECT_RC=<n> -DEXPECT_REGEX=<regex> -P RunExpectError.cmake
# Runs COMMAND; passes when it exits with EXPECT_RC, its stderr matches EXPECT_REGEX, and neither
# stream holds an uncaught-exception or MPI abort report (the error must be printed cleanly).
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message(STATUS "exit code: ${rc}\nstdout:\n${out}\nstderr:\n${err}")
if(NOT rc EQUAL EXPECT_RC)
  message(FATAL_ERROR "expected exit code ${EXPECT_RC}, got ${rc}")
endif()
if(NOT err MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "stderr does not match: ${EXPECT_REGEX}")
endif()
if("${out}${err}" MATCHES "terminate called|MPI_ABORT|Abort|core dumped")
  message(FATAL_ERROR "the error was not handled cleanly")
endif()
