# Installs meshtensor into a scratch prefix, then configures, builds and runs a small program that
# finds it with find_package(meshtensor). -DBUILD_DIR -DSCRATCH -DCONSUMER_SOURCE -DKOKKOS_DIR -DGENERATOR
# Optional: -DCOPY_EXAMPLE=<dir> an example's sources (its main.cpp and the headers beside it)
# copied into (a copy of) the project, as a user copies an example; -DBUILD_TYPE (default Release);
# -DCXX_FLAGS (the project's CMAKE_CXX_FLAGS); -DRUN_ARGS (a ;-list); -DEXPECT (a regex of the output,
# default "consumer ok"); -DREFUSED_ARGS (a ;-list) with -DREFUSED_EXPECT: a second run that must
# fail with that message.
file(REMOVE_RECURSE ${SCRATCH})
if(NOT DEFINED BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
if(NOT DEFINED EXPECT)
  set(EXPECT "consumer ok")
endif()
if(COPY_EXAMPLE)
  file(COPY ${CONSUMER_SOURCE}/ DESTINATION ${SCRATCH}/src)
  file(GLOB example_sources ${COPY_EXAMPLE}/*.cpp ${COPY_EXAMPLE}/*.hpp)
  file(COPY ${example_sources} DESTINATION ${SCRATCH}/src)
  set(CONSUMER_SOURCE ${SCRATCH}/src)
endif()
macro(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endmacro()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${SCRATCH}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${SCRATCH}/build -G "${GENERATOR}"
    -DCMAKE_PREFIX_PATH=${SCRATCH}/prefix -DKokkos_DIR=${KOKKOS_DIR} -DCMAKE_BUILD_TYPE=${BUILD_TYPE}
    "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}")
run(${CMAKE_COMMAND} --build ${SCRATCH}/build)
run(${SCRATCH}/build/consumer ${RUN_ARGS})
message(STATUS "${out}")
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the consumer ran but did not print '${EXPECT}':\n${out}")
endif()
if(DEFINED REFUSED_ARGS)
  execute_process(COMMAND ${SCRATCH}/build/consumer ${REFUSED_ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT "${out}${err}" MATCHES "${REFUSED_EXPECT}")
    message(FATAL_ERROR "consumer ${REFUSED_ARGS} should have failed with '${REFUSED_EXPECT}' (exit ${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "refused as expected: ${err}")
endif()
