#!/usr/bin/env bash
# The mixture-of-experts training step with and without its all-to-alls overlapped, side by side in
# one run: examples/llama with a routed MoE in every block (nn::routed_moe: 8 SwiGLU experts, top 2,
# capacity 64 tokens per sequence), data layout on [N x 1] (the experts split over every rank: each
# block's dispatch and return are one alltoall over all of them), at 2 and 4 ranks, --expert-chunks
# 1 (no overlap) against 2 and 4 (the next chunk's dispatch and the last one's return in flight
# while a chunk's experts compute). Prints a Markdown table (docs/performance.md).
#
#   scripts/dev/bench_moe_overlap.sh [--rounds 5] [--steps 8] [--warmup 2] [--against BUILD] [--dispatch ragged]
#
# --dispatch ragged: the dropless ragged dispatch (--capacity 0 --moe-dispatch ragged), whose
# chunks are of each rank's experts (8 over N ranks: --expert-chunks 1, 2 and 4 at 2 ranks, 1 and
# 2 at 4) rather than of the buffers' slots.
#
# --against BUILD: BUILD/examples/llama (another commit's, built as this script builds it: e.g. a
# `git worktree` of it with MESHTENSOR_BUILD_DIR set) runs every configuration too, interleaved,
# and the table's last column is this build's median over it.
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
rounds=5 steps=8 warmup=2 against="" dispatch=one-hot
bench_args "$0" 2,24 --rounds:rounds --steps:steps --warmup:warmup --against:against --dispatch:dispatch -- "$@"
case $dispatch in one-hot | ragged) ;; *) echo "bench_moe_overlap: --dispatch is '$dispatch'; expected one-hot or ragged" >&2; exit 2 ;; esac
build=${MESHTENSOR_BUILD_DIR:-$root/build/bench_moe}
bench_build_target "$build" llama -- -DMESHTENSOR_BUILD_TESTS=OFF -DMESHTENSOR_BUILD_BENCHMARKS=OFF \
  -DMESHTENSOR_LLAMA_LAYOUT=data
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
echo "[bench_moe_overlap] dispatch: $dispatch; CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc --all) cores; OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}; load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

routing=(--capacity 64)
[ "$dispatch" = ragged ] && routing=(--capacity 0 --moe-dispatch ragged)
model=(--experts 8 --top-k 2 "${routing[@]}" --d-model 256 --layers 2 --kv-heads 2 --group 2 --d-kv 64 --d-ff 512
       --batch 8 --length 256 --layout data --text "$root/README.md")
declare -A got binary
binary[this]="$build/examples/llama"
[ -z "$against" ] || binary[against]="$against/examples/llama"
# run BUILD RANKS CHUNKS: the median tokens/s of the steps after the warm-up
run() {
  mpiexec -n "$2" "${binary[$1]}" "${model[@]}" --mesh "$2" 1 --steps "$steps" --log-every 1 --expert-chunks "$3" |
    awk -v w="$warmup" '/^step / { if (++k > w) print $(NF - 1) }' | median
}
configs=()
shapes=("2 1" "2 2" "2 4" "4 1" "4 2" "4 4")
[ "$dispatch" = ragged ] && shapes=("2 1" "2 2" "2 4" "4 1" "4 2")  # at most a rank's 8 / N experts
for c in "${shapes[@]}"; do
  configs+=("this $c")
  [ -z "$against" ] || configs+=("against $c")
done
for round in $(seq "$rounds"); do
  for c in "${configs[@]}"; do
    got[$c]+="$(run $c) "
    echo "[bench_moe_overlap] round $round, build, ranks and chunks $c: ${got[$c]}" >&2
  done
done
of() { tr ' ' '\n' <<<"${got[$1]}" | grep . | "${@:2}"; }
if [ -n "$against" ]; then
  echo "| build | ranks | --expert-chunks | tokens/s (median of $rounds rounds; min, max) | against 1 chunk | this build against --against |"
  echo "|---|---|---|---|---|---|"
else
  echo "| build | ranks | --expert-chunks | tokens/s (median of $rounds rounds; min, max) | against 1 chunk |"
  echo "|---|---|---|---|---|"
fi
for c in "${configs[@]}"; do
  read -r b n k <<<"$c"
  m=$(of "$c" median) base=$(of "$b $n 1" median) lo=$(of "$c" sort -g | head -1) hi=$(of "$c" sort -g | tail -1)
  row=$(awk -v b="$b" -v n="$n" -v k="$k" -v m="$m" -v base="$base" -v lo="$lo" -v hi="$hi" \
    'BEGIN { printf "| %s | %d | %d | %.0f (%.0f, %.0f) | %.3f |", b, n, k, m, lo, hi, m / base }')
  if [ -n "$against" ]; then
    [ "$b" = this ] && row+=$(awk -v m="$m" -v a="$(of "against $n $k" median)" 'BEGIN { printf " %.3f |", m / a }') || row+=" |"
  fi
  echo "$row"
done
echo "[bench_moe_overlap] load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
