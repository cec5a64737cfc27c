#!/usr/bin/env bash
# kill_restart_test.sh SUPERVISE TRANSFORMER_LM MPIEXEC WORKDIR: a training job whose ranks are
# killed three times ends, under scripts/supervise.sh, with the parameters of a job never killed,
# bit for bit (docs/checkpoints.md, "Restarting after a failure").
#
# meshtensor-lm on 4 ranks ([2 x 2], layout 2d, or as FAULTS_JOB says: common.sh; dropout 0.1), 80
# steps, a checkpoint every 10. First a clean run. Then the same job under the supervisor
# (--restarts 3) while this script kills one rank chosen at random (SIGKILL) three times: each time
# at a random step 1..15 steps past the attempt's first checkpoint (so the checkpoint it resumes
# from and the steps run twice vary). The supervised job must exit 0 after exactly 3 restarts, each
# logged with its cause (the killed rank and signal 9) and the step it resumed from; its last
# checkpoint must equal the clean run's byte for byte, and the losses of its last attempt the clean
# run's. MESHTENSOR_FAULTS_SEED repeats a run.
set -euo pipefail
supervise=$1 lm=$2 mpiexec=$3 work=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=common.sh
source "$here/common.sh"
rm -rf "$work"
mkdir -p "$work/clean"
seed_random "these kills"
save_every=10
common=("${job[@]}" --dropout 0.1 --steps 80 --save-every "$save_every" --log-every 1)
started=$(date +%s.%N)

clean_run

out=$work/supervised.out sup=""
finish() {
  local pid
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then kill -TERM "$sup" 2>/dev/null || true; sleep 1; fi
  for pid in $(rank_pids "$work/supervised.csv"); do kill -KILL "$pid" 2>/dev/null || true; done
}
trap finish EXIT
"$supervise" --restarts 3 --log "$work/supervise.log" -- "$mpiexec" -n 4 "$lm" "${common[@]}" \
  --checkpoint "$work/ckpt" --csv "$work/supervised.csv" >"$out" 2>&1 &
sup=$!

fail() { echo "$*"; echo "--- the supervised job's output:"; cat "$out"; exit 1; }
from=0 resumed=0 victims=()
for k in 1 2 3; do
  if [ "$k" -gt 1 ]; then
    # The k-th attempt: "resumed from DIR at step S".
    hit=$(wait_line "$out" "$from" "^resumed from .* at step [0-9]+" 60 "$sup") || fail "attempt $k did not resume"
    from=${hit%%:*}
    resumed=$(sed -E 's/.* at step ([0-9]+).*/\1/' <<<"${hit#*:}")
  fi
  draw 15
  target=$(( resumed + save_every + 1 + drawn ))
  hit=$(wait_line "$out" "$from" "^step +$target/" 60 "$sup") || fail "attempt $k did not reach step $target"
  wait_rank_pids 4 "$work/supervised.csv" || fail "attempt $k: found ${#pids[@]} ranks, not 4: ${pids[*]}"
  draw 4
  pid=${pids[drawn]}
  rank=$(rank_of "$pid")
  kill -KILL "$pid"
  victims+=("$rank")
  echo "kill $k: SIGKILL to rank $rank (pid $pid) after step $target (attempt $k resumed at step $resumed)"
  from=${hit%%:*}
done

status=0
wait "$sup" || status=$?
sup=""
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "--- the supervisor's lines:"
grep '^supervise: ' "$out" || true
[ "$status" -eq 0 ] || fail "the supervised job ended with status $status"
restarts=$(grep -c -E '^supervise: restart [0-9]+/3 after: ' "$out" || true)
[ "$restarts" -eq 3 ] || fail "$restarts restarts, not 3"
[ "$(grep -c -E 'supervise: restart [0-9]+/3 after: ' "$work/supervise.log")" -eq 3 ] || fail "--log $work/supervise.log lacks the restarts"
for k in 1 2 3; do
  grep -q -E "^supervise: restart $k/3 after: rank ${victims[k - 1]} exited on signal 9 \(Killed\)$" "$out" ||
    fail "restart $k does not name rank ${victims[k - 1]} and signal 9 as its cause"
done
[ "$(grep -c -E '^supervise: resuming from .*/step-[0-9]+.* \(step [0-9]+\)$' "$out")" -eq 3 ] ||
  fail "not every restart names the checkpoint it resumed from"
same_result || fail "the killed run's result differs from the clean run's"
echo "3 kills, 3 restarts, same result as the clean run; ${elapsed}s in all"
