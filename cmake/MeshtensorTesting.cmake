# Helpers to run programs under mpiexec as ctest entries.
#
# OpenMPI refuses to run as root and to place more ranks than cores unless told; its environment
# variables say so without changing the command line of other MPI implementations.
set(MESHTENSOR_MPI_ENV
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    OMP_NUM_THREADS=1 OMP_PROC_BIND=false
    # A program started without mpiexec (the planned runs: lm.published_plans starts about 150)
    # is an OpenMPI singleton, which starts a daemon of its own unless isolated: 0.3 s against 0.5
    # for MPI_Init and MPI_Finalize. Nothing here spawns processes, which isolation rules out.
    OMPI_MCA_ess_singleton_isolated=1
    # The tests run on one node, where ob1 (shared memory, TCP between the multihost tests' "hosts")
    # is the transport. Open MPI's default picks UCX, whose start-up idles 0.2 s in every process:
    # MPI_Init and MPI_Finalize 0.25 s against 0.03 as a singleton, mpiexec -n 4 0.43 s against 0.22.
    OMPI_MCA_pml=ob1
    # ctest runs several jobs at once on few cores: a rank waiting in a collective yields its core
    # to the other jobs' ranks instead of polling through its time slice (Open MPI turns this on by
    # itself only when one job holds more ranks than cores).
    OMPI_MCA_mpi_yield_when_idle=1
    # Every op compares the collectives it ran with its static plan (ops/op_call.hpp).
    MESHTENSOR_CHECK_PLANS=1)
set(MESHTENSOR_MPI_TIMEOUT 300 CACHE STRING "Seconds before an MPI test counts as hung")

# Open MPI keeps a job's session directory under <orte_tmpdir_base>/ompi.<host>.<uid>/jf.<family>.
# Isolated singletons (above) all take family 0, so two tests that start programs without mpiexec
# at once share one directory, which one removes as it ends while another creates it: "A call to
# mkdir was unable to create the desired directory: /tmp/ompi.<host>.0/jf.0/1", orte_init fails
# (`ctest -L '^unit$' -j 6` isolated: 4 tests failed in 3 runs). meshtensor_mpi_sessions_apart(),
# deferred to the end of each directory that adds tests, gives each test whose environment isolates
# singletons a base of its own, named by a hash of the test's directory and name, under a root of
# the configuring user's (Open MPI creates what is missing with mode 0700: a root shared by users
# would be the first one's). A test's own programs start one after another.
if(NOT DEFINED CACHE{MESHTENSOR_MPI_SESSION_ROOT})
  execute_process(COMMAND id -u OUTPUT_VARIABLE meshtensor_uid OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  set(MESHTENSOR_MPI_SESSION_ROOT "/tmp/meshtensor-mpi-${meshtensor_uid}" CACHE PATH
      "Where each test's Open MPI session directories go (a directory per test below it; the user who runs the tests owns it)")
endif()
# (The unit tests' script in tests/CMakeLists.txt names theirs the same way when ctest runs.)
function(meshtensor_mpi_session_base test out)
  string(MD5 id "${CMAKE_CURRENT_BINARY_DIR}/${test}")
  string(SUBSTRING "${id}" 0 12 id)
  set(${out} "${MESHTENSOR_MPI_SESSION_ROOT}/${id}" PARENT_SCOPE)
endfunction()
function(meshtensor_mpi_sessions_apart)
  get_property(tests DIRECTORY PROPERTY TESTS)
  foreach(test IN LISTS tests)
    get_test_property(${test} ENVIRONMENT env)
    if("OMPI_MCA_ess_singleton_isolated=1" IN_LIST env AND NOT env MATCHES "OMPI_MCA_orte_tmpdir_base=")
      meshtensor_mpi_session_base(${test} base)
      set_property(TEST ${test} APPEND PROPERTY ENVIRONMENT "OMPI_MCA_orte_tmpdir_base=${base}")
    endif()
  endforeach()
endfunction()
# In each directory that adds tests (anywhere in it: the call runs at the directory's end).
macro(meshtensor_tests_directory)
  cmake_language(DEFER CALL meshtensor_mpi_sessions_apart)
endmacro()

# The tests, examples and benchmarks link with gold where the toolchain has it: half of ld.bfd's
# time on a test program (0.7 s against 1.5 s), for about 30 programs. Users' builds are left alone.
include(CheckLinkerFlag)
check_linker_flag(CXX "-fuse-ld=gold" MESHTENSOR_HAVE_GOLD)
if(MESHTENSOR_HAVE_GOLD AND NOT Kokkos_ENABLE_CUDA)
  add_link_options(-fuse-ld=gold)
endif()

# meshtensor_use_optimization(<flag>): the targets of this directory and below compile at <flag>
# in place of the build type's -O (nvcc_wrapper warns at two of them). An empty flag keeps the
# build type's.
#
# With a flag (a tree built to be tested) and g++ as the compiler, g++ also collects its garbage
# less often (MESHTENSOR_GCC_GC_PARAMS): a tenth less compile time for a third more memory, 1.4 GB
# for the largest test TU (docs/performance.md). Set it empty to keep g++'s own.
set(MESHTENSOR_GCC_GC_PARAMS "--param=ggc-min-expand=400;--param=ggc-min-heapsize=262144" CACHE STRING
    "g++ garbage-collector settings of the trees built to be tested (empty: g++'s own)")
macro(meshtensor_use_optimization)
  if(NOT "${ARGN}" STREQUAL "")
    foreach(config IN ITEMS RELEASE RELWITHDEBINFO MINSIZEREL DEBUG)
      string(REGEX REPLACE "(^| )-O[0-9sg]?( |$)" " " CMAKE_CXX_FLAGS_${config} "${CMAKE_CXX_FLAGS_${config}}")
    endforeach()
    add_compile_options(${ARGN})
    if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND NOT Kokkos_ENABLE_CUDA)
      add_compile_options(${MESHTENSOR_GCC_GC_PARAMS})
      # At -O0 g++ (from 12) compiles each std::move and std::forward of each type as a function
      # unless told to fold them: about 5% of a test TU's functions, 2-3% of its time.
      if("${ARGN}" STREQUAL "-O0" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 12)
        add_compile_options(-ffold-simple-inlines)
      endif()
    endif()
  endif()
endmacro()

# meshtensor_reuse_lm_pch(<target>...): in a tree built to be tested (MESHTENSOR_EXAMPLE_OPTIMIZATION
# set, so every example and benchmark compiles with the same flags), these targets reuse meshtensor-lm's
# (tools/lm) precompiled header instead of each parsing the library again (about 2.5 s per TU). Other
# trees keep their own parse: there `scripts/run_example.sh`'s matmul alone would otherwise wait for
# the header of meshtensor-lm. nvcc has no precompiled headers. GCC uses the header only where the -D
# flags match its own: the targets get meshtensor-lm's definitions, those of its libraries included
# ({fmt}'s FMT_SHARED). REUSE_FROM wants its target defined already, and the examples are added before
# tools/: targets named before meshtensor-lm exists wait in a global list that tools/lm applies
# (meshtensor_reuse_lm_pch_pending); without tools (MESHTENSOR_BUILD_TOOLS off) they keep their
# own parse.
function(meshtensor_reuse_lm_pch)
  if(NOT "${MESHTENSOR_EXAMPLE_OPTIMIZATION}" STREQUAL "" AND NOT Kokkos_ENABLE_CUDA)
    if(TARGET meshtensor-lm)
      foreach(target IN LISTS ARGN)
        target_precompile_headers(${target} REUSE_FROM meshtensor-lm)
        target_compile_definitions(${target} PRIVATE $<TARGET_PROPERTY:meshtensor-lm,COMPILE_DEFINITIONS>)
      endforeach()
    else()
      set_property(GLOBAL APPEND PROPERTY MESHTENSOR_LM_PCH_PENDING ${ARGN})
    endif()
  endif()
endfunction()
# Called by tools/lm once meshtensor-lm is defined: the targets that asked before.
function(meshtensor_reuse_lm_pch_pending)
  get_property(pending GLOBAL PROPERTY MESHTENSOR_LM_PCH_PENDING)
  set_property(GLOBAL PROPERTY MESHTENSOR_LM_PCH_PENDING "")
  if(pending)
    meshtensor_reuse_lm_pch(${pending})
  endif()
endfunction()

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
