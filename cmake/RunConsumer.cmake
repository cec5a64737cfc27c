# Installs meshtensor into a scratch prefix, then configures, builds and runs a small program that
# finds it with find_package(meshtensor). -DBUILD_DIR -DSCRATCH -DCONSUMER_SOURCE -DKOKKOS_DIR -DGENERATOR
file(REMOVE_RECURSE ${SCRATCH})
macro(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
endmacro()
run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${SCRATCH}/prefix)
run(${CMAKE_COMMAND} -S ${CONSUMER_SOURCE} -B ${SCRATCH}/build -G "${GENERATOR}"
    -DCMAKE_PREFIX_PATH=${SCRATCH}/prefix -DKokkos_DIR=${KOKKOS_DIR} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${SCRATCH}/build)
run(${SCRATCH}/build/consumer)
message(STATUS "${out}")
if(NOT out MATCHES "consumer ok")
  message(FATAL_ERROR "the consumer ran but did not print 'consumer ok':\n${out}")
endif()
