#!/usr/bin/env bash
# The GPU check, in one command, on a machine with an NVIDIA GPU, the CUDA toolkit, CMake, g++ and
# PyTorch but no package registry, from the folder scripts/gpu_prepare.sh made on a machine that has
# one (Debian's .debs and the CUDA Kokkos, about 40 MiB):
#   1. unpacks the .debs into a prefix of their own (never over /), and puts the Kokkos back;
#   2. builds, with nvcc at -O1 on every core, the programs that exercise the GPU: matmul, the optimizer's,
#      elementwise, einsum, reductions (softmax) and reshape tests, the data-movement, fused,
#      layer-gradient and ring-attention tests, bench_local and meshtensor-lm (tools/lm);
#   3. runs the tests at 1 and 2 ranks sharing the GPU (every op checking its plan; the optimizer's
#      test: no allocation in a steady-state step), the matmul example on [2 x 2], bench_local's
#      products against cuBLAS called directly, bench_op_overhead against PyTorch eager, the
#      Transformer step against PyTorch on the same GPU (float32 against eager and torch.compile,
#      bf16 against autocast), by kernel (--kernel-times) and its memory (the measured peak against
#      the plan's and PyTorch's), the Transformer with its sequence over 2 ranks (ring attention)
#      against the data layout, and what the GPU sustains
#      (scripts/dev/gpu_calibrate.py).
# MESHTENSOR_GPU_TARGETS narrows the programs built, MESHTENSOR_GPU_SKIP (a regex) the steps run.
# Keeps going past a failure and ends with a summary; exit status 1 if anything failed. Each phase
# has a time limit, so that the whole fits in 10 minutes.
#
#   scripts/gpu_check.sh [DIR] [OUT]     # DIR default .gpu, OUT (results) default $OUT or build/gpu_check
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/.gpu}
out=${2:-${OUT:-$root/build/gpu_check}}
mkdir -p "$out"
exec > >(tee "$out/gpu_check.log") 2>&1
start=$SECONDS
log() { echo "[gpu_check +$((SECONDS - start))s] $*"; }
failed=()
step() {  # name seconds command...: runs it with a limit, records a failure
  local name=$1 limit=$2; shift 2
  # MESHTENSOR_GPU_SKIP: a regex of the steps to leave out (a second run measuring one thing).
  if [ -n "${MESHTENSOR_GPU_SKIP:-}" ] && [[ $name =~ $MESHTENSOR_GPU_SKIP ]]; then log "skipped: $name"; return; fi
  log "$name"
  if ! timeout "$limit" "$@"; then
    failed+=("$name")
    log "FAILED: $name"
  fi
}

[ -d "$dir/debs" ] && [ -f "$dir/kokkos/PREFIX" ] || { echo "gpu_check.sh: no $dir from scripts/gpu_prepare.sh" >&2; exit 2; }
log "$(nvidia-smi -L 2>&1 | head -n 1); nvcc: $(nvcc --version 2>/dev/null | tail -n 1); g++: $(g++ -dumpfullversion 2>&1); cmake: $(cmake --version | head -n 1)"
export PATH="/usr/local/cuda/bin:$PATH"

# 1. Dependencies in a prefix of their own.
deps=/opt/meshtensor-gpu-deps
mkdir -p "$deps"
for f in "$dir"/debs/*.deb; do dpkg -x "$f" "$deps"; done
# Links that name an absolute path (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) lead into the
# prefix instead.
find "$deps" -type l -lname '/*' | while read -r link; do
  target=$(readlink "$link")
  if [ -e "$deps$target" ]; then ln -sfn "$deps$target" "$link"; fi
done
kokkos=$(cat "$dir/kokkos/PREFIX")
mkdir -p "$(dirname "$kokkos")"
cp -a "$dir/kokkos/$(basename "$kokkos")" "$(dirname "$kokkos")/"
# The CUDA libraries Kokkos's CMake files name by the paths of the machine that built it
# (/usr/local/cuda/lib/libcudart.so, lib/stubs/libcuda.so): where this machine keeps them
# elsewhere, those paths lead to its own.
for lib in $(grep -rho '/[^;" ]*/lib[a-z]*\.so' "$kokkos/lib/cmake" | sort -u); do
  if [ ! -e "$lib" ]; then
    found=$(find /usr/local/cuda/ -name "$(basename "$lib")" -path "*$(basename "$(dirname "$lib")")*" 2>/dev/null | head -n 1)
    [ -n "$found" ] || found=$(find /usr/local/cuda/ /usr/lib/x86_64-linux-gnu -name "$(basename "$lib")" 2>/dev/null | head -n 1)
    if [ -n "$found" ]; then mkdir -p "$(dirname "$lib")" && ln -s "$found" "$lib" && log "linked $lib -> $found"; fi
  fi
done
# OpenMPI and PMIx look for their plugins, help files and wrapper data at the paths they were built
# with; where this machine has none, those paths lead into the prefix.
for d in usr/lib/x86_64-linux-gnu/openmpi usr/lib/x86_64-linux-gnu/pmix2 usr/share/openmpi usr/share/pmix etc/openmpi; do
  if [ ! -e "/$d" ] && [ -e "$deps/$d" ]; then mkdir -p "$(dirname "/$d")" && ln -s "$deps/$d" "/$d"; fi
done
# The commands Debian reaches through alternatives (made by its install scripts, which dpkg -x
# does not run).
for cmd in mpicxx mpicc mpiexec mpirun; do ln -sfn "$cmd.openmpi" "$deps/usr/bin/$cmd"; done
arch=usr/lib/x86_64-linux-gnu
export PATH="$deps/usr/bin:$PATH"
export LD_LIBRARY_PATH="$deps/$arch:$deps/$arch/openblas-pthread:$deps/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false MESHTENSOR_CHECK_PLANS=1
# This OpenMPI and PMIx are relocated: their plugins are the prefix's, never the machine's own (an
# OpenMPI already installed there has plugins of another version at the same paths).
export OPAL_PREFIX="$deps/usr" PMIX_INSTALL_PREFIX="$deps/usr"
export PMIX_MCA_pcompress_base_silence_warning=1  # PMIx's zlib plugin is not carried; nothing here is large
log "mpiexec: $(mpiexec --version 2>&1 | head -n 1); cores: $(getconf _NPROCESSORS_ONLN) online, $(nproc) usable; load: $(cut -d" " -f1-3 /proc/loadavg)"

# 2. Build.
build=$root/build/gpu_check
# MESHTENSOR_GPU_TARGETS narrows the set (e.g. "matmul bench_local"). Every core is used
# (getconf: nproc said 1 on the H100 machine, whose command runs with an affinity of one core): there
# meshtensor-lm's 12 TUs (then) and a 4-TU test program built in 100 s.
read -r -a targets <<<"${MESHTENSOR_GPU_TARGETS:-matmul bench_local bench_op_overhead meshtensor-lm mpi_optim_test mpi_elementwise_test mpi_einsum_test mpi_reductions_test mpi_reshape_test mpi_data_movement_equivalence_test mpi_nn_gradient_test mpi_fused_equivalence_test mpi_ring_attention_gradient_test}"
generator=(); keep_going=()
if command -v ninja >/dev/null; then generator=(-G Ninja); keep_going=(-- -k 0); else keep_going=(-- -k); fi
step configure 120 cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKokkos_ROOT="$kokkos" \
  -DCMAKE_CXX_COMPILER="$kokkos/bin/nvcc_wrapper" -DMPI_CXX_COMPILER="$deps/usr/bin/mpicxx" \
  "-DCMAKE_PREFIX_PATH=$deps/usr" -DBLAS_LIBRARIES="$deps/$arch/openblas-pthread/libopenblas.so" \
  "-DCMAKE_CXX_FLAGS=-isystem $deps/usr/include/x86_64-linux-gnu/openblas-pthread" \
  -DZLIB_ROOT="$deps/usr" -DMESHTENSOR_EXAMPLE_OPTIMIZATION=-O1
# The small programs first, so that a build that runs out of time still leaves something to run.
jobs=$(getconf _NPROCESSORS_ONLN)
first=(); rest=()
for t in "${targets[@]}"; do case $t in matmul | bench_*) first+=("$t") ;; *) rest+=("$t") ;; esac; done
[ "${#first[@]}" -eq 0 ] || step "build ${first[*]}" 150 cmake --build "$build" -j "$jobs" --target "${first[@]}" "${keep_going[@]}"
[ "${#rest[@]}" -eq 0 ] || step "build ${rest[*]}" "${MESHTENSOR_GPU_BUILD_SECONDS:-300}" cmake --build "$build" -j "$jobs" --target "${rest[@]}" "${keep_going[@]}"

# 3. Run what was built.
run_built() {  # target dir name seconds ranks [args...]: skipped unless asked for, a failure unless built
  local target=$1 exe="$build/$2/$1" name=$3 limit=$4 ranks=$5; shift 5
  # (MESHTENSOR_CHECK_PLANS=0 before the call reaches the ranks: mpiexec passes the environment on.)
  [[ " ${targets[*]} " == *" $target "* ]] || return 0
  [ -x "$exe" ] || { failed+=("$target (not built)"); return; }
  step "$name" "$limit" mpiexec -n "$ranks" "$exe" "$@"
}
# The newest first: a run that reaches its time limit has run them.
tests=(mpi_optim_test mpi_ring_attention_gradient_test mpi_elementwise_test mpi_einsum_test mpi_reductions_test mpi_reshape_test
       mpi_data_movement_equivalence_test mpi_nn_gradient_test mpi_fused_equivalence_test)
# Of the programs named by subject, the equivalence cases (their gradients and plans are the CPU suite's).
by_subject=" mpi_elementwise_test mpi_einsum_test mpi_reductions_test mpi_reshape_test "
# One op's fixed cost on tiny tensors, ours and its parts, and PyTorch eager's (issue 59's item 1).
MESHTENSOR_CHECK_PLANS=0 run_built bench_op_overhead benchmarks "op overhead, ours" 90 1 --benchmark_out="$out/op_overhead_ours.json" \
  --benchmark_out_format=json
[ -f "$out/op_overhead_ours.json" ] && step "op overhead, PyTorch beside ours" 90 python3 \
  "$root/benchmarks/peers/torch_op_overhead.py" --device cuda --ours "$out/op_overhead_ours.json" --out "$out/op_overhead.json"
run_built bench_local benchmarks "bench_local: einsum against cuBLAS" 90 1 \
  --benchmark_filter='matmul|attn' --benchmark_out="$out/bench_local.json" --benchmark_out_format=json
# The Transformer step at a GPU's size, ours and PyTorch's, on the same GPU.
model=(--batch 16 --length 512 --d-model 1024 --heads 8 --d-kv 128 --d-ff 4096 --vocab 8192)
# Timed without the tests' plan checks (MESHTENSOR_CHECK_PLANS=0), as a user runs.
MESHTENSOR_CHECK_PLANS=0 run_built meshtensor-lm tools/lm "transformer step, ours" 90 1 --layout data --mesh 1 1 \
  "${model[@]}" --steps 13 --warmup 3 --log-every 100000 --csv "$out/loss.csv"
# Where our step's time goes, by kernel (each waited for alone).
run_built meshtensor-lm tools/lm "transformer step, ours, by kernel" 90 1 --layout data --mesh 1 1 "${model[@]}" \
  --steps 4 --log-every 100000 --kernel-times
# The step's memory on the GPU: the caching allocator's measured peak against the plan's (the
# tests check it on the CPU); PyTorch's peak is printed by its step below.
run_built meshtensor-lm tools/lm "transformer step, planned against measured memory" 90 1 --layout data --mesh 1 1 \
  "${model[@]}" --check-plan
step "transformer step, PyTorch" 90 python3 "$root/tools/lm/torch_reference.py" bench "${model[@]}" \
  --warmup 3 --steps 10 --device cuda
# bf16 products (float master weights) against PyTorch's autocast; torch.compile's float32 step as
# the next mark.
MESHTENSOR_CHECK_PLANS=0 run_built meshtensor-lm tools/lm "transformer step bf16, ours" 90 1 --layout data --mesh 1 1 "${model[@]}" \
  --dtype bf16 --steps 13 --warmup 3 --log-every 100000
step "transformer step bf16, PyTorch autocast" 90 python3 "$root/tools/lm/torch_reference.py" bench "${model[@]}" \
  --warmup 3 --steps 10 --device cuda --dtype bf16
step "transformer step, torch.compile" 150 python3 "$root/tools/lm/torch_reference.py" bench "${model[@]}" \
  --warmup 3 --steps 10 --device cuda --compile
# Context parallelism on the GPU: the sequence over 2 ranks, attention by the ring, the same losses
# as the data layout (what ctest's lm.context_agrees.ring checks on the CPU).
run_built meshtensor-lm tools/lm "transformer, ring attention over 2 ranks = data layout" 90 2 --compare-layouts \
  --layouts data context --attention ring --steps 10 --mesh 1 2 --length 30 --dropout 0.1 --tolerance 1e-5
# What the GPU sustains (products in bf16 and float32, memory, a kernel's fixed cost), for the cost
# model's calibration of a GPU machine (scripts/dev/published_plans.py).
step "GPU rates (PyTorch)" 90 python3 "$root/scripts/dev/gpu_calibrate.py" --out "$out/gpu_calibration.json"
run_built matmul examples "matmul example on [2 x 2]" 60 4 --size 1024
for n in 1 2; do
  for t in "${tests[@]}"; do
    filter=()
    [[ $by_subject == *" $t "* ]] && filter=("[equivalence]")
    [ "$t" = mpi_optim_test ] && filter=("[memory]")  # no Kokkos allocation in a steady-state step
    limit=45
    [ "$t" = mpi_ring_attention_gradient_test ] && limit=120  # its cases sweep many layouts, small kernels
    run_built "$t" tests "$t at $n rank(s)" "$limit" "$n" "${filter[@]}"
  done
done

log "summary: $((SECONDS - start)) s; ${#failed[@]} failed${failed:+: ${failed[*]}}"
[ "${#failed[@]}" -eq 0 ]
