#!/usr/bin/env bash
# Checkpoint throughput (docs/performance.md, "Checkpoints"): mt::io::save and load of 256 MB and
# 1 GB of float parameters on 1, 2 and 4 ranks, beside this disk's raw speed measured in the same
# run: dd writing as many bytes (from /dev/zero, so that no generator limits it) with fsync (conv=fsync) and reading them back after dropping the
# page cache. Each figure is the median of --rounds rounds (default 3). Dropping the page cache
# needs root; without it loads may come from memory (the table says which).
#   scripts/dev/bench_checkpoint.sh [--rounds 3] [--sizes "256 1024"] [--dir DIR]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rounds=3 sizes="256 1024" dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "bench_checkpoint.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
export MESHTENSOR_BUILD_DIR=${MESHTENSOR_BUILD_DIR:-$root/build/bench}
MESHTENSOR_TARGETS=bench_checkpoint
# shellcheck source-path=SCRIPTDIR source=../common.sh
source "$root/scripts/common.sh"
configure_and_build -DMESHTENSOR_EXAMPLE_OPTIMIZATION= >&2
export OMP_NUM_THREADS=1
dir=${dir:-$BUILD_DIR/checkpoint-bench}
mkdir -p "$dir"
can_drop=0
if [ "$(id -u)" = 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then can_drop=1; fi
drop() { sync; [ "$can_drop" = 0 ] || echo 3 >/proc/sys/vm/drop_caches; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg); page cache dropped before reads: $([ $can_drop = 1 ] && echo yes || echo no)"
echo
echo "| MB | what | ranks | seconds (median of $rounds) | MB/s | vs dd |"
echo "|---|---|---|---|---|---|"
for mb in $sizes; do
  w=() r=()
  for k in $(seq "$rounds"); do
    drop
    w+=("$( { /usr/bin/time -f %e dd if=/dev/zero of="$dir/dd.bin" bs=1M count="$mb" conv=fsync status=none; } 2>&1 )")
    drop
    r+=("$( { /usr/bin/time -f %e dd if="$dir/dd.bin" of=/dev/null bs=1M status=none; } 2>&1 )")
  done
  rm -f "$dir/dd.bin"
  dd_w=$(printf '%s\n' "${w[@]}" | median) dd_r=$(printf '%s\n' "${r[@]}" | median)
  echo "| $mb | dd write + fsync | 1 | $dd_w | $(awk -v m="$mb" -v s="$dd_w" 'BEGIN{printf "%.0f", m/s}') | 1.00 |"
  echo "| $mb | dd read | 1 | $dd_r | $(awk -v m="$mb" -v s="$dd_r" 'BEGIN{printf "%.0f", m/s}') | 1.00 |"
  for n in 1 2 4; do
    out=$(MESHTENSOR_BENCH_DROP_CACHES=$can_drop mpiexec -n "$n" "$BUILD_DIR/benchmarks/bench_checkpoint" "$dir" "$mb" "$rounds")
    s=$(echo "$out" | awk '{print $2}' | median) l=$(echo "$out" | awk '{print $4}' | median)
    echo "| $mb | mt::io::save | $n | $s | $(awk -v m="$mb" -v s="$s" 'BEGIN{printf "%.0f", m/s}') | $(awk -v a="$dd_w" -v b="$s" 'BEGIN{printf "%.2f", a/b}') |"
    echo "| $mb | mt::io::load | $n | $l | $(awk -v m="$mb" -v s="$l" 'BEGIN{printf "%.0f", m/s}') | $(awk -v a="$dd_r" -v b="$l" 'BEGIN{printf "%.2f", a/b}') |"
  done
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
