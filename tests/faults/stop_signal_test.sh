#!/usr/bin/env bash
# stop_signal_test.sh SUPERVISE TRANSFORMER_LM MPIEXEC WORKDIR: SIGTERM to one rank of a training job
# stops every rank after the same step, with a checkpoint, and a resumed run ends with the
# parameters of a job never stopped, bit for bit (docs/cluster.md; runtime/stop_request.hpp).
#
# meshtensor-lm on 4 ranks ([2 x 2], layout 2d, or as FAULTS_JOB says: common.sh; dropout 0.1), 40
# steps, no periodic checkpoint. Under scripts/supervise.sh, after step 4 or later, one rank chosen
# at random (and only it) gets SIGTERM. The job must say it stopped on SIGTERM after a step S < 40,
# save the checkpoint of step S, and exit with status 85 (mt::stopped_exit_code); the supervisor
# must not restart it and exit 85. A rank that stopped alone would leave the others waiting: the
# collective watchdog (MESHTENSOR_COLLECTIVE_TIMEOUT=20, which also watches the agreement's
# allreduce) turns that into a failure within seconds instead of a hang. Then `--resume` continues
# to step 40: its final checkpoint must equal a clean run's byte for byte, and its losses the clean
# run's. MESHTENSOR_FAULTS_SEED repeats a run.
set -euo pipefail
supervise=$1 lm=$2 mpiexec=$3 work=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$here/common.sh"
rm -rf "$work"
mkdir -p "$work/clean"
seed_random "this run"
steps=40
common=("${job[@]}" --dropout 0.1 --steps "$steps" --save-every "$steps" --log-every 1)
export MESHTENSOR_COLLECTIVE_TIMEOUT=20
started=$(date +%s.%N)

clean_run

out=$work/supervised.out sup=""
finish() {
  local pid
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then kill -TERM "$sup" 2>/dev/null || true; sleep 1; fi
  for pid in $(rank_pids "$work/supervised.csv"); do kill -KILL "$pid" 2>/dev/null || true; done
}
trap finish EXIT
"$supervise" --log "$work/supervise.log" -- "$mpiexec" -n 4 "$lm" "${common[@]}" \
  --checkpoint "$work/ckpt" --csv "$work/supervised.csv" >"$out" 2>&1 &
sup=$!
fail() { echo "$*"; echo "--- the supervised job's output:"; cat "$out"; exit 1; }

wait_line "$out" 0 "^step +4/" 60 "$sup" >/dev/null || fail "the job did not reach step 4"
wait_rank_pids 4 "$work/supervised.csv" || fail "found ${#pids[@]} ranks, not 4: ${pids[*]}"
draw 4
pid=${pids[drawn]}
rank=$(rank_of "$pid")
kill -TERM "$pid"
echo "SIGTERM to rank $rank (pid $pid) alone, after step 4"

status=0
wait "$sup" || status=$?
sup=""
echo "--- the job's last lines and the supervisor's:"
grep -E '^(stopped on|saved checkpoint|supervise: )' "$out" || true
[ "$status" -eq 85 ] || fail "the supervised job ended with status $status, not 85 (stopped with a checkpoint)"
line=$(grep -m 1 -E "^stopped on SIGTERM after step [0-9]+ of $steps: " "$out") || fail "the job did not say it stopped on SIGTERM"
at=$(sed -E 's/.*after step ([0-9]+) of.*/\1/' <<<"$line")
[ "$at" -ge 4 ] && [ "$at" -lt "$steps" ] || fail "stopped after step $at, not in 4..$((steps - 1))"
[ "$(cat "$work/ckpt/latest")" = "$(printf 'step-%08d' "$at")" ] || fail "the latest checkpoint is $(cat "$work/ckpt/latest"), not step $at's"
grep -q -E '^supervise: the job stopped on a signal with its checkpoint saved \(exit status 85\); not restarted$' "$out" ||
  fail "the supervisor did not report the stop (or restarted the job)"
grep -q -E '^supervise: restart' "$out" && fail "the supervisor restarted a job that stopped on a signal"
[ "$(wc -l <"$work/supervised.csv")" -eq $((at + 1)) ] || fail "the stopped run wrote $(($(wc -l <"$work/supervised.csv") - 1)) losses, not $at"

if ! "$mpiexec" -n 4 "$lm" "${common[@]}" --checkpoint "$work/ckpt" --resume "$work/ckpt" --csv "$work/supervised.csv" \
     >"$work/resumed.out" 2>&1; then
  echo "the resumed run failed:"; cat "$work/resumed.out"; exit 1
fi
grep -q "^resumed from $work/ckpt at step $at " "$work/resumed.out" || { echo "the run did not resume:"; cat "$work/resumed.out"; exit 1; }
same_result || fail "the stopped and resumed run's result differs from the clean run's"
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "SIGTERM to rank $rank: all 4 ranks stopped after step $at with its checkpoint, exit status 85, not restarted; resumed, same result as the clean run; ${elapsed}s in all"
