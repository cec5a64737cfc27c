# Builds one target that must NOT compile, then checks that the compiler's output matches every
# "// expect: <regex>" line of the source (the sentence and the offending names).
# -DBUILD_DIR=... -DTARGET=... -DSOURCE=...
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BUILD_DIR} --target ${TARGET}
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(APPEND out "${err}")
if(result EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled, but it must not")
endif()
file(STRINGS ${SOURCE} expects REGEX "^// expect: ")
if(NOT expects)
  message(FATAL_ERROR "${SOURCE} has no '// expect: <regex>' line")
endif()
foreach(line IN LISTS expects)
  string(REGEX REPLACE "^// expect: " "" regex "${line}")
  if(NOT out MATCHES "${regex}")
    message(FATAL_ERROR "${SOURCE}: the compiler's output does not match '${regex}'. Output:\n${out}")
  endif()
  message(STATUS "matched: ${regex}")
endforeach()
