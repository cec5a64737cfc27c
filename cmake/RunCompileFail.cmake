# Builds one target that must NOT compile, then checks that the compiler's output matches every
# "// expect: <regex>" line of the source (the sentence and the offending names), and that the
# first "error:" line of the output matches every "// expect-first: <regex>" line (so that the
# sentence is not buried under errors that come before it).
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
file(STRINGS ${SOURCE} expect_firsts REGEX "^// expect-first: ")
if(expect_firsts)
  string(REGEX MATCH "[^\n]*error:[^\n]*" first_error "${out}")
  foreach(line IN LISTS expect_firsts)
    string(REGEX REPLACE "^// expect-first: " "" regex "${line}")
    if(NOT first_error MATCHES "${regex}")
      message(FATAL_ERROR "${SOURCE}: the compiler's first error does not match '${regex}'. It is:\n"
                          "${first_error}\nOutput:\n${out}")
    endif()
    message(STATUS "matched first error: ${regex}")
  endforeach()
endif()
