# cmake -DDIR=<dir> -DRUN=<;-list> -DCHECK=<;-list> -P RunCrosscheck.cmake
# Empties DIR, runs RUN (our program, which writes its results to DIR), then CHECK (which
# recomputes them another way and compares). Fails when either fails; CHECK's exit code 77 is
# passed on (the ctest entry counts it as skipped: the other side is not installed).
file(REMOVE_RECURSE "${DIR}")
file(MAKE_DIRECTORY "${DIR}")
execute_process(COMMAND ${RUN} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the run exited with ${rc}")
endif()
execute_process(COMMAND ${CHECK} RESULT_VARIABLE rc)
if(rc EQUAL 77)
  message("SKIPPED: the check's dependencies are missing")
  return()
endif()
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the check exited with ${rc}: the results disagree")
endif()
