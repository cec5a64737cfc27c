# cuda_build: configures meshtensor with a CUDA Kokkos (through its nvcc_wrapper) and compiles a
# representative set of targets, then checks that each executable carries GPU code (a .nv_fatbin
# section) for the architecture Kokkos was built for. Compiles only: CI has no GPU.
# cmake -DSOURCE_DIR= -DBINARY_DIR= -DKOKKOS_ROOT= -DTARGETS="a;b" -DJOBS=n -P build.cmake
foreach(var SOURCE_DIR BINARY_DIR KOKKOS_ROOT TARGETS JOBS)
  if(NOT DEFINED ${var} OR "${${var}}" STREQUAL "")
    message(FATAL_ERROR "cuda_build: ${var} is not set")
  endif()
endforeach()
set(wrapper "${KOKKOS_ROOT}/bin/nvcc_wrapper")
if(NOT EXISTS "${wrapper}")
  message(FATAL_ERROR "cuda_build: no ${wrapper}: is ${KOKKOS_ROOT} a CUDA Kokkos? (scripts/install_deps.sh --backends serial,openmp,cuda)")
endif()

# From an empty tree every time: nvcc_wrapper writes no dependency files, so make would keep objects
# compiled from headers that have changed since, and pass on stale code.
file(REMOVE_RECURSE ${BINARY_DIR})
# The host side at -O0: what is checked is that the code compiles for the GPU and carries GPU code,
# not how fast the host side runs (device code is optimised by cicc and ptxas whatever the host's -O).
# g++ compiling the host side is the larger part of nvcc's time: at -O0 rather than -O1 the Llama
# example's TU took 133 s of host compile rather than 199 (286 s in all rather than 365; nvcc -time).
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -DCMAKE_BUILD_TYPE=Release
                        -DKokkos_ROOT=${KOKKOS_ROOT} -DCMAKE_CXX_COMPILER=${wrapper} -DMESHTENSOR_EXAMPLE_OPTIMIZATION=-O0
                        -DMESHTENSOR_TEST_OPTIMIZATION=-O0
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cuda_build: configuring with ${KOKKOS_ROOT} failed:\n${out}")
endif()
if(NOT EXISTS "${KOKKOS_ROOT}/include/KokkosCore_config.h")
  message(FATAL_ERROR "cuda_build: no KokkosCore_config.h under ${KOKKOS_ROOT}/include")
endif()
file(STRINGS "${KOKKOS_ROOT}/include/KokkosCore_config.h" cuda_define REGEX "^#define KOKKOS_ENABLE_CUDA$")
if(NOT cuda_define)
  message(FATAL_ERROR "cuda_build: ${KOKKOS_ROOT} is a Kokkos without CUDA (no KOKKOS_ENABLE_CUDA in KokkosCore_config.h)")
endif()

# All targets in one build, so that both cores compile (most of them are one TU each: built one
# after another, one core sat idle).
string(TIMESTAMP start "%s")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target ${TARGETS} -j ${JOBS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cuda_build: the targets (${TARGETS}) failed to compile with nvcc:\n${out}")
endif()
foreach(target IN LISTS TARGETS)
  # A program, or an object library's objects (a subset of a program's TUs).
  file(GLOB_RECURSE built LIST_DIRECTORIES false "${BINARY_DIR}/*/${target}")
  if(NOT built)  # at any depth: tools/lm/CMakeFiles/<target>.dir/ as well as examples/CMakeFiles/...
    file(GLOB_RECURSE objects LIST_DIRECTORIES false "${BINARY_DIR}/*.o")
    list(FILTER objects INCLUDE REGEX "/CMakeFiles/${target}\\.dir/")
    set(built ${objects})
  endif()
  if(NOT built)
    message(FATAL_ERROR "cuda_build: target ${target} built, but no executable or object named for it is under ${BINARY_DIR}")
  endif()
  foreach(file IN LISTS built)
    execute_process(COMMAND objdump -h ${file} RESULT_VARIABLE rc OUTPUT_VARIABLE sections ERROR_VARIABLE sections)
    if(NOT sections MATCHES "\\.nv_fatbin")
      message(FATAL_ERROR "cuda_build: ${file} has no .nv_fatbin section: no GPU code was compiled into it")
    endif()
  endforeach()
endforeach()
message(STATUS "cuda_build: ${TARGETS} compiled with nvcc in ${seconds} s, GPU code present in each")
