# Installs meshtensor into a scratch prefix, then configures, builds and runs a small program that
# finds it with find_package(meshtensor). -DBUILD_DIR -DSCRATCH -DCONSUMER_SOURCE -DKOKKOS_DIR -DGENERATOR
# Optional: -DCOPY_MAIN=<file> copied into (a copy of) the project as main.cpp, as a user copies an
# example; -DBUILD_TYPE (default Release); -DRUN_ARGS (a ;-list); -DEXPECT (a regex of the output,
# default "consumer ok").
file(REMOVE_RECURSE ${SCRATCH})
if(NOT DEFINED BUILD_TYPE)
  set(BUILD_TYPE Release)
endif()
if(NOT DEFINED EXPECT)
  set(EXPECT "consumer ok")
endif()
if(COPY_MAIN)
  file(COPY ${CONSUMER_SOURCE}/ DESTINATION ${SCRATCH}/src)
  configure_file(${COPY_MAIN} ${SCRATCH}/src/main.cpp COPYONLY)
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
    -DCMAKE_PREFIX_PATH=${SCRATCH}/prefix -DKokkos_DIR=${KOKKOS_DIR} -DCMAKE_BUILD_TYPE=${BUILD_TYPE})
run(${CMAKE_COMMAND} --build ${SCRATCH}/build)
run(${SCRATCH}/build/consumer ${RUN_ARGS})
message(STATUS "${out}")
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "the consumer ran but did not print '${EXPECT}':\n${out}")
endif()
