# cuda_build: configures meshtensor with a CUDA Kokkos (through its nvcc_wrapper) and compiles a
# representative set of targets, then checks that each of their TUs produced GPU code (a cubin with
# kernels) for the architecture Kokkos was built for. Compiles only: CI has no GPU.
#
# nvcc runs its whole device side (cudafe++'s checks, cicc, ptxas), but the host side only as far
# as g++'s -fsyntax-only: parsed and instantiated, every CUDA-only host path included, no object
# code. Nothing links. Code generation was most of the host compile at -O0 and the largest part of
# nvcc's time: the along-dim ops' test took 80 s with objects, 50 s without (host g++ 49 against
# 16 s; `nvcc --time`). The device code is kept (--keep) in each object's directory and checked
# there.
# cmake -DSOURCE_DIR= -DBINARY_DIR= -DKOKKOS_ROOT= -DTARGETS="a;b" -DJOBS=n [-DHOST_BUILD_DIR=] -P build.cmake
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
# The Llama example's context layout alone (MESHTENSOR_LLAMA_LAYOUT): it attends both by all-to-all
# (which calls the local attention the other layouts use) and by the ring; the four layouts'
# kernels are the same kinds, instantiated for other tensor types (nvcc, one TU: 142 s against 265).
# The host side at -O0: what is checked is that the code compiles for the GPU and carries GPU code,
# not how fast the host side runs (device code is optimised by cicc and ptxas whatever the host's -O).
# g++ compiling the host side is the larger part of nvcc's time: at -O0 rather than -O1 the Llama
# example's TU took 133 s of host compile rather than 199 (286 s in all rather than 365; nvcc -time).

# The link and library checks the host tree's configure made (HOST_BUILD_DIR's cache): given, nvcc
# does not try them again, at about 2 s a try_compile through nvcc_wrapper. They hold here because
# nothing of this tree links, and nvcc_wrapper's host compiler is the g++ the host tree uses.
set(host_results)
if(HOST_BUILD_DIR AND EXISTS "${HOST_BUILD_DIR}/CMakeCache.txt")
  file(STRINGS "${HOST_BUILD_DIR}/CMakeCache.txt" found
       REGEX "^(MESHTENSOR_HAVE_GOLD|CMAKE_HAVE_LIBC_PTHREAD|BLAS_WORKS|BLAS_openblas_WORKS):INTERNAL=")
  foreach(entry IN LISTS found)
    string(REPLACE ":INTERNAL=" "=" entry "${entry}")
    list(APPEND host_results "-D${entry}")
  endforeach()
endif()
set(compile_rule "<CMAKE_CXX_COMPILER> <DEFINES> <INCLUDES> <FLAGS> -Xcompiler -fsyntax-only --keep --keep-dir=<OBJECT_DIR> -o <OBJECT> -c <SOURCE>")
set(no_link "${CMAKE_COMMAND} -E touch <TARGET>")
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR} -B ${BINARY_DIR} -DCMAKE_BUILD_TYPE=Release
                        -DKokkos_ROOT=${KOKKOS_ROOT} -DCMAKE_CXX_COMPILER=${wrapper} -DMESHTENSOR_EXAMPLE_OPTIMIZATION=-O0
                        -DMESHTENSOR_TEST_OPTIMIZATION=-O0 -DMESHTENSOR_TEST_KERNEL_KINDS_ONLY=ON -DMESHTENSOR_LLAMA_LAYOUT=context
                        "-DMESHTENSOR_BUILD_SET=${TARGETS}"
                        ${host_results}
                        "-DCMAKE_CXX_COMPILE_OBJECT=${compile_rule}"
                        "-DCMAKE_CXX_LINK_EXECUTABLE=${no_link}" "-DCMAKE_CXX_CREATE_STATIC_LIBRARY=${no_link}"
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

# All targets as one make goal (meshtensor_build_set, the top-level CMakeLists.txt), so that both
# cores compile: given as several goals, make built them one after another (most are one TU each:
# one core sat idle), and the tests' main, which two of them link and whose rule here writes no
# object, was compiled once per goal.
string(TIMESTAMP start "%s")
execute_process(COMMAND ${CMAKE_COMMAND} --build ${BINARY_DIR} --target meshtensor_build_set -j ${JOBS}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(TIMESTAMP end "%s")
math(EXPR seconds "${end} - ${start}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "cuda_build: the targets (${TARGETS}) failed to compile with nvcc:\n${out}")
endif()
# Every TU of every target left a cubin with at least one kernel (.text.<kernel> sections) in the
# target's object directory (nvcc --keep names it after the source: main.cpp -> main.sm_90.cubin).
foreach(target IN LISTS TARGETS)
  file(GLOB_RECURSE depend_info LIST_DIRECTORIES false "${BINARY_DIR}/*DependInfo.cmake")
  list(FILTER depend_info INCLUDE REGEX "/CMakeFiles/${target}\\.dir/DependInfo\\.cmake$")
  if(NOT depend_info)
    message(FATAL_ERROR "cuda_build: no target ${target} under ${BINARY_DIR}")
  endif()
  get_filename_component(object_dir ${depend_info} DIRECTORY)
  set(CMAKE_DEPENDS_DEPENDENCY_FILES)
  include(${depend_info})  # source, object, compiler, depfile: four entries per TU
  set(sources)
  foreach(entry IN LISTS CMAKE_DEPENDS_DEPENDENCY_FILES)
    if(entry MATCHES "\\.(cpp|cc|cxx)$")
      list(APPEND sources ${entry})
    endif()
  endforeach()
  if(NOT sources)
    message(FATAL_ERROR "cuda_build: ${depend_info} lists no source of ${target}")
  endif()
  foreach(source IN LISTS sources)
    get_filename_component(stem ${source} NAME_WLE)
    file(GLOB cubin "${object_dir}/${stem}.sm_*.cubin")
    if(NOT cubin)
      message(FATAL_ERROR "cuda_build: ${source} (${target}) compiled, but left no ${object_dir}/${stem}.sm_*.cubin: no GPU code was compiled for it")
    endif()
    execute_process(COMMAND readelf -S -W ${cubin} OUTPUT_VARIABLE sections ERROR_QUIET)
    if(NOT sections MATCHES " \\.text\\.")
      message(FATAL_ERROR "cuda_build: ${cubin} (${source}) holds no kernel: no .text.<kernel> section")
    endif()
  endforeach()
endforeach()
# nvcc's other intermediates (preprocessed sources, PTX: about 100 MB a TU) are not needed again.
file(GLOB_RECURSE intermediates LIST_DIRECTORIES false "${BINARY_DIR}/*.ii" "${BINARY_DIR}/*.cudafe1.*"
     "${BINARY_DIR}/*.fatbin.c" "${BINARY_DIR}/*.ptx")
if(intermediates)
  file(REMOVE ${intermediates})
endif()
message(STATUS "cuda_build: ${TARGETS} compiled with nvcc in ${seconds} s, GPU code present in each TU")
