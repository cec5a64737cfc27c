#!/usr/bin/env bash
# The mixture-of-experts training step with and without its all-to-alls overlapped, side by side in
# one run: examples/llama with a routed MoE in every block (nn::routed_moe: 8 SwiGLU experts, top 2,
# capacity 64 tokens per sequence), data layout on [N x 1] (the experts split over every rank: each
# block's dispatch and return are one alltoall over all of them), at 2 and 4 ranks, --expert-chunks
# 1 (no overlap) against 2 and 4 (the next chunk's dispatch and the last one's return in flight
# while a chunk's experts compute). Prints a Markdown table (docs/performance.md).
#
#   scripts/dev/bench_moe_overlap.sh [--rounds 5] [--steps 8] [--warmup 2]
#
# Each round runs every configuration once, interleaved; each run's figure is the median tokens/s
# of its steps after the warm-up; the table holds the median over the rounds (min and max beside)
# and its ratio to --expert-chunks 1 at the same ranks. Model: d_model 256, 2 layers, 4 query heads
# of 64 in 2 KV groups, experts' d_ff 512, batch 8 x 256 tokens, vocabulary 256 (bytes of
# README.md), float32. One thread per rank. MESHTENSOR_BUILD_DIR (default build/bench_moe) and
# MESHTENSOR_BUILD_JOBS choose where and how the example is built (-O3, the data layout alone).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5 steps=8 warmup=2
bench_args "$0" 2,16 --rounds:rounds --steps:steps --warmup:warmup -- "$@"
build=${MESHTENSOR_BUILD_DIR:-$root/build/bench_moe}
bench_build_target "$build" llama -- -DMESHTENSOR_BUILD_TESTS=OFF -DMESHTENSOR_BUILD_BENCHMARKS=OFF \
  -DMESHTENSOR_LLAMA_LAYOUT=data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
echo "[bench_moe_overlap] CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

model=(--experts 8 --top-k 2 --capacity 64 --d-model 256 --layers 2 --kv-heads 2 --group 2 --d-kv 64 --d-ff 512
       --batch 8 --length 256 --layout data --text "$root/README.md")
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
# run RANKS CHUNKS: the median tokens/s of the steps after the warm-up
run() {
  mpiexec -n "$1" "$build/examples/llama" "${model[@]}" --mesh "$1" 1 --steps "$steps" --log-every 1 --expert-chunks "$2" |
    awk -v w="$warmup" '/^step / { if (++k > w) print $(NF - 1) }' | median
}
configs=("2 1" "2 2" "2 4" "4 1" "4 2" "4 4")
declare -A got
for round in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    got[$c]+="$(run $c) "
    echo "[bench_moe_overlap] round $round, ranks and chunks $c: ${got[$c]}" >&2
  done
done
echo "| ranks | --expert-chunks | tokens/s (median of $rounds rounds; min, max) | against 1 chunk |"
echo "|---|---|---|---|"
for c in "${configs[@]}"; do
  read -r n k <<<"$c"
  m=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | median)
  base=$(tr ' ' '\n' <<<"${got[$n 1]}" | grep . | median)
  lo=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | sort -g | head -1)
  hi=$(tr ' ' '\n' <<<"${got[$c]}" | grep . | sort -g | tail -1)
  awk -v n="$n" -v k="$k" -v m="$m" -v b="$base" -v lo="$lo" -v hi="$hi" \
    'BEGIN { printf "| %d | %d | %.0f (%.0f, %.0f) | %.3f |\n", n, k, m, lo, hi, m / b }'
done
echo "[bench_moe_overlap] load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
