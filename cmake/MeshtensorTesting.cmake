# Helpers to run programs under mpiexec as ctest entries.
#
# OpenMPI refuses to run as root and to place more ranks than cores unless told; its environment
# variables say so without changing the command line of other MPI implementations.
set(MESHTENSOR_MPI_ENV
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    OMP_NUM_THREADS=1 OMP_PROC_BIND=false)
set(MESHTENSOR_MPI_TIMEOUT 300 CACHE STRING "Seconds before an MPI test counts as hung")

# meshtensor_add_mpi_test(NAME <name> TARGET <target> RANKS 1 2 4 LABELS ... [ARGS ...] [ENV VAR=value ...])
# adds one ctest entry per rank count: <name>.np<N>.
function(meshtensor_add_mpi_test)
  cmake_parse_arguments(T "" "NAME;TARGET;TIMEOUT" "RANKS;LABELS;ARGS;ENV" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT ${MESHTENSOR_MPI_TIMEOUT})
  endif()
  set(env ${MESHTENSOR_MPI_ENV} ${T_ENV})
  foreach(n IN LISTS T_RANKS)
    add_test(NAME ${T_NAME}.np${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS}
                     $<TARGET_FILE:${T_TARGET}> ${MPIEXEC_POSTFLAGS} ${T_ARGS})
    set_tests_properties(${T_NAME}.np${n} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT}
                         ENVIRONMENT "${env}" PROCESSORS ${n})
  endforeach()
endfunction()
