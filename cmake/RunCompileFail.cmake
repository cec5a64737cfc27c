# Builds the target that holds the compile_fail cases, which must NOT compile, and saves what the
# compiler printed to OUTPUT_FILE for the cases' checks (cmake/CheckCompileFail.py). Fails only where
# nothing can be checked: the build failed without a compiler's error, or the compiler stopped early.
# -DBUILD_DIR=... -DTARGET=... -DOUTPUT_FILE=...
file(REMOVE ${OUTPUT_FILE})  # a case never reads an earlier run's output
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(APPEND out "${err}")
# A fatal error (a header not found), an internal error or exhausted memory ends the TU early: the
# cases after that point would all seem to compile.
if(out MATCHES "compilation terminated|internal compiler error|confused by earlier errors|virtual memory exhausted|out of memory")
  message(FATAL_ERROR "the compiler stopped before the end of ${TARGET}'s TU; no case can be judged:\n${out}")
endif()
if(NOT result EQUAL 0 AND NOT out MATCHES ":[0-9]+:[0-9]+: error: ")
  message(FATAL_ERROR "building ${TARGET} failed before the compiler reported an error:\n${out}")
endif()
file(WRITE ${OUTPUT_FILE} "${out}")
if(result EQUAL 0)
  message(STATUS "${TARGET} compiled: every case will report that it compiled")
else()
  message(STATUS "${TARGET} did not compile, as it must not; its output is in ${OUTPUT_FILE}")
endif()
