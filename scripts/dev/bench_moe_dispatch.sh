#!/usr/bin/env bash
# The mixture-of-experts training step by its two dispatches, side by side in one run: examples/llama
# with a routed MoE in every block (nn::routed_moe: 16 SwiGLU experts of d_ff 256, top 4, sigmoid
# scores), data layout on [N x 1] (the experts split over every rank), at 2 and 4 ranks:
#   one-hot, capacity 80   Mesh-TensorFlow's dispatch and combine einsums over buffers of 80 slots
#                          (256 tokens x 4 / 16 x 1.25), choices past them dropped
#   one-hot, dropless      the same with buffers of the whole sequence (--capacity 0)
#   ragged, dropless       each token's rows to its experts' ranks, one product per expert
# Prints a Markdown table (docs/performance.md): tokens/s and the ratio to the ragged dispatch.
#
#   scripts/dev/bench_moe_dispatch.sh [--rounds 5] [--steps 8] [--warmup 2]
#
# Each round runs every configuration once, interleaved; each run's figure is the median tokens/s
# of its steps after the warm-up; the table holds the median over the rounds (min and max beside).
# Model: d_model 256, 2 layers, 4 query heads of 64 in 2 KV groups, batch 8 x 256 tokens,
# vocabulary 256 (bytes of README.md), float32. One thread per rank. MESHTENSOR_BUILD_DIR (default
# build/bench_moe) and MESHTENSOR_BUILD_JOBS choose where and how the example is built (-O3, the data
# layout alone), as scripts/dev/bench_moe_overlap.sh's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5 steps=8 warmup=2
bench_args "$0" 2,20 --rounds:rounds --steps:steps --warmup:warmup -- "$@"
build=${MESHTENSOR_BUILD_DIR:-$root/build/bench_moe}
bench_build_target "$build" llama -- -DMESHTENSOR_BUILD_TESTS=OFF -DMESHTENSOR_BUILD_BENCHMARKS=OFF \
  -DMESHTENSOR_LLAMA_LAYOUT=data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
echo "[bench_moe_dispatch] CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

model=(--experts 16 --top-k 4 --router sigmoid --d-model 256 --layers 2 --kv-heads 2 --group 2 --d-kv 64 --d-ff 256
       --batch 8 --length 256 --layout data --text "$root/README.md")
declare -A got
# run RANKS DISPATCH CAPACITY: the median tokens/s of the steps after the warm-up
run() {
  mpiexec -n "$1" "$build/examples/llama" "${model[@]}" --mesh "$1" 1 --steps "$steps" --log-every 1 \
    --moe-dispatch "$2" --capacity "$3" | awk -v w="$warmup" '/^step / { if (++k > w) print $(NF - 1) }' | median
}
configs=()
for n in 2 4; do configs+=("$n one-hot 80" "$n one-hot 0" "$n ragged 0"); done
for round in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    # shellcheck disable=SC2086
    got[$c]+="$(run $c) "
    echo "[bench_moe_dispatch] round $round, ranks, dispatch and capacity $c: ${got[$c]}" >&2
  done
done
of() { tr ' ' '\n' <<<"${got[$1]}" | grep . | "${@:2}"; }
echo "| ranks | dispatch | --capacity | tokens/s (median of $rounds rounds; min, max) | against ragged |"
echo "|---|---|---|---|---|"
for c in "${configs[@]}"; do
  read -r n d k <<<"$c"
  m=$(of "$c" median) base=$(of "$n ragged 0" median) lo=$(of "$c" sort -g | head -1) hi=$(of "$c" sort -g | tail -1)
  awk -v n="$n" -v d="$d" -v k="$k" -v m="$m" -v base="$base" -v lo="$lo" -v hi="$hi" \
    'BEGIN { printf "| %d | %s | %s | %.0f (%.0f, %.0f) | %.3f |\n", n, d, (k == 0 ? "0 (dropless)" : k), m, lo, hi, m / base }'
done
echo "[bench_moe_dispatch] load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
