#!/usr/bin/env bash
# straggler_test.sh TRANSFORMER_LM MPIEXEC WORKDIR: one rank made slow on purpose is named by the
# slow-rank report (runtime/straggler.hpp), and no other rank is.
#
# meshtensor-lm on 4 ranks ([2 x 2], layout 2d, or as FAULTS_JOB says: common.sh), 200 steps, a
# report every 40 (--log-every 40, --straggler-warn 0.2). One rank, chosen at random, does 20 ms of
# extra work per step (a sleep: the example's test hook MESHTENSOR_TEST_SLOW_RANK, a slow node).
# Every report must name that rank as the slowest, with a WARNING; no report may warn of another
# rank. Why a sleep and not SIGSTOP bursts from outside: a rank stopped while it waits in a
# collective counts that time as waiting, not work, and with four ranks on two cores most of a
# stretch is waiting, so the bursts named the rank only now and then; a slow node is slow in its own
# work, which the sleep is.
set -euo pipefail
lm=$1 mpiexec=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$here/common.sh"
rm -rf "$work"
mkdir -p "$work"
seed_random "this run"
draw 4
slow_rank=$drawn
echo "rank $slow_rank does 20 ms of extra work per step"
out=$work/out
if ! MESHTENSOR_TEST_SLOW_RANK="$slow_rank,20" "$mpiexec" -n 4 "$lm" "${job[@]}" --steps 200 --log-every 40 \
     --straggler-warn 0.2 --csv "$work/loss.csv" >"$out" 2>&1; then
  echo "the job failed:"; cat "$out"; exit 1
fi
fail() { echo "$*"; echo "--- the job's output:"; cat "$out"; exit 1; }
grep -E "slowest: rank" "$out" || fail "no slow-rank report"
mapfile -t reports < <(grep -E "slowest: rank" "$out")
[ "${#reports[@]}" -ge 5 ] || fail "${#reports[@]} reports, not 5"
for line in "${reports[@]}"; do
  [[ $line == *"slowest: rank $slow_rank (world $slow_rank)"*WARNING* ]] ||
    fail "a report does not name rank $slow_rank as the slowest with a warning: $line"
done
if grep -E "WARNING" "$out" | grep -vqE "slowest: rank $slow_rank \(world $slow_rank\)"; then
  fail "a report warns of another rank than $slow_rank"
fi
echo "every report named rank $slow_rank with a warning, and no other rank"
