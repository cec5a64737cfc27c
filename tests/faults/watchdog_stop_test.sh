#!/usr/bin/env bash
# watchdog_stop_test.sh SUPERVISE TRANSFORMER_LM MPIEXEC WORKDIR [TIMEOUT]: a rank that stops
# (SIGSTOP: a hung process, a node that no longer answers) ends the job by the collective watchdog
# within TIMEOUT seconds plus a few, and the supervisor restarts it from its checkpoint to the
# result of a job never stopped, bit for bit (docs/design/faults.md, "Faults").
#
# meshtensor-lm on 4 ranks ([2 x 2], layout 2d, or as FAULTS_JOB says: common.sh; dropout 0.1), 60
# steps, a checkpoint every 10; first a clean run (no watchdog). Then the same job under the
# supervisor (--restarts 1) with MESHTENSOR_COLLECTIVE_TIMEOUT=TIMEOUT (default 3), and one rank,
# chosen at random, stopped with SIGSTOP 1..10 steps past the first checkpoint. The other ranks wait
# in a collective; the job must end (the supervisor's restart line) no sooner than TIMEOUT - 1 s and
# no later than TIMEOUT + 5 s after the SIGSTOP, its output must have a line `meshtensor: collective
# watchdog: ...`, the first of which, where it is a polled collective's, names the stopped rank (and
# only it) as not answering; the restart line must name the watchdog as the cause, the stopped process must be gone, and the resumed job must exit 0 with
# the clean run's final checkpoint, byte for byte. A stopped process is never left behind (SIGCONT
# and SIGKILL at exit).
set -euo pipefail
supervise=$1 lm=$2 mpiexec=$3 work=$4 timeout=${5:-3}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$here/common.sh"
rm -rf "$work"
mkdir -p "$work/clean"
seed_random "this run"
save_every=10
common=("${job[@]}" --dropout 0.1 --steps 60 --save-every "$save_every" --log-every 1)
started=$(date +%s.%N)

(unset MESHTENSOR_COLLECTIVE_TIMEOUT; clean_run)

out=$work/supervised.out sup="" stopped=""
finish() {
  local pid
  if [ -n "$stopped" ] && kill -0 "$stopped" 2>/dev/null; then
    kill -CONT "$stopped" 2>/dev/null || true
    kill -KILL "$stopped" 2>/dev/null || true
  fi
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then kill -TERM "$sup" 2>/dev/null || true; sleep 1; fi
  for pid in $(rank_pids "$work/supervised.csv"); do
    kill -CONT "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
}
trap finish EXIT
MESHTENSOR_COLLECTIVE_TIMEOUT=$timeout "$supervise" --restarts 1 -- "$mpiexec" -n 4 "$lm" "${common[@]}" \
  --checkpoint "$work/ckpt" --csv "$work/supervised.csv" >"$out" 2>&1 &
sup=$!

fail() { echo "$*"; echo "--- the supervised job's output:"; cat "$out"; exit 1; }
draw 10
target=$(( save_every + 1 + drawn ))
hit=$(wait_line "$out" 0 "^step +$target/" 60 "$sup") || fail "the job did not reach step $target"
from=${hit%%:*}
wait_rank_pids 4 "$work/supervised.csv" || fail "found ${#pids[@]} ranks, not 4: ${pids[*]}"
draw 4
pid=${pids[drawn]}
rank=$(rank_of "$pid")
kill -STOP "$pid"
stopped=$pid
t0=$(date +%s.%N)
echo "SIGSTOP to rank $rank (pid $pid) after step $target; MESHTENSOR_COLLECTIVE_TIMEOUT=$timeout"

# The job's end: the supervisor's restart line.
hit=$(wait_line "$out" "$from" "^supervise: restart 1/1 after: " $(( timeout + 30 )) "$sup") ||
  fail "the job did not end within $(( timeout + 30 ))s of the SIGSTOP (is there a collective watchdog?)"
t1=$(date +%s.%N)
ended=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", b - a }')
echo "the job ended ${ended}s after the SIGSTOP"
restart_line=${hit#*:}
for _ in $(seq 40); do kill -0 "$stopped" 2>/dev/null || break; sleep 0.05; done
if kill -0 "$stopped" 2>/dev/null; then fail "the stopped rank $rank (pid $stopped) outlived its job"; fi
stopped=""

status=0
wait "$sup" || status=$?
sup=""
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "--- the watchdog's lines:"
grep '^meshtensor: collective watchdog:' "$out" || true
echo "--- the supervisor's lines:"
grep '^supervise: ' "$out" || true
awk -v a="$ended" -v t="$timeout" 'BEGIN { exit !(a >= t - 1 && a <= t + 5) }' ||
  fail "the job ended ${ended}s after the SIGSTOP, not within ${timeout}s - 1 .. + 5"
grep -q '^meshtensor: collective watchdog:' "$out" || fail "no line 'meshtensor: collective watchdog: ...'"
# The first watchdog line, where it is a polled collective's, names the stopped rank, and only it, as
# not answering at all: "...; not answering at all: rank 2 (stopped, dead, or busy outside any
# collective); ...". A rank stopped inside a checkpoint's save leaves the others in its MPI-IO, which
# cannot be polled: their lines name the save instead ("... in checkpoint save to '...' (blocking
# MPI-IO, ..."). Only the first line is sure to describe the stopped job: once a rank has ended,
# mpiexec resumes every rank (SIGCONT, then SIGTERM) to end the job, so the stopped rank answers
# the notices of a rank still in its grace period, and the ranks that ended answer none (a run of
# seed 662799 named rank 3 as "waiting in another collective" and ranks 0, 1 as not answering after
# ranks 0 and 1 had timed out in a save).
first=$(grep -m 1 '^meshtensor: collective watchdog:' "$out")
if [[ $first != *" in checkpoint save to '"*"(blocking MPI-IO, which cannot be polled"* ]]; then
  named=$(sed -nE 's/.*; not answering at all: ranks? ([0-9]+(, [0-9]+)*) \(.*/\1/p' <<<"$first")
  [ "$named" = "$rank" ] ||
    fail "the first watchdog line does not name the stopped rank $rank (and only it) as not answering (named: ${named:-none}): $first"
fi
[[ $restart_line == "supervise: restart 1/1 after: meshtensor: collective watchdog: "* ]] ||
  fail "the restart does not name the watchdog as its cause: $restart_line"
grep -q -E '^supervise: resuming from .*/step-[0-9]+.* \(step [0-9]+\)$' "$out" || fail "no line naming the checkpoint resumed from"
[ "$status" -eq 0 ] || fail "the supervised job ended with status $status"
same_result || fail "the stopped run's result differs from the clean run's"
echo "stopped rank $rank: watchdog ended the job in ${ended}s (timeout ${timeout}s), 1 restart, same result as the clean run; ${elapsed}s in all"
