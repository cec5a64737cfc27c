#!/usr/bin/env bash
# kill_test.sh TOOL MPIEXEC WORKDIR TRIALS [loop|loop-async]: kills checkpoint saves with SIGKILL at
# random moments and checks each time that the current checkpoint still loads whole
# (docs/checkpoints.md). loop-async: the saves of io::async_checkpoints, whose files are written by
# a thread while the next values are made; the chosen phases are begin, writing (the thread's,
# held there), renamed and current.
# Each trial starts `checkpoint_tool loop` (2 ranks, one save after another of 16 MB) and kills
# the whole job (SIGKILL to its process group): odd trials after a random delay (mostly while data
# is written, the longest phase), even trials at a chosen phase in turn (begin, written, renamed,
# current: MESHTENSOR_CHECKPOINT_PAUSE_AT holds rank 0 there until the kill). After each kill,
# `checkpoint_tool verify` on 1, 2 or 4 ranks must load the current checkpoint and find every value
# right, and its step must never go back. The phase each kill landed in (the trace's last line) is
# tallied; the test fails unless every one of the four phases was hit.
set -euo pipefail
tool=$1 mpiexec=$2 work=$3 trials=$4 loop=${5:-loop}
rm -rf "$work"
mkdir -p "$work"
dir=$work/ckpt
run() { "$mpiexec" -n "$1" "$tool" "${@:2}"; }

run 2 loop "$dir" 1 16 >/dev/null   # one complete checkpoint before the first kill
declare -A phases
last_step=0
targets=(begin written renamed current)
[ "$loop" = loop ] || targets=(begin writing renamed current)
RANDOM=$$
for t in $(seq 1 "$trials"); do
  trace=$work/trace.$t
  : >"$trace"
  if [ $((t % 2)) = 1 ]; then
    target="" delay=$(awk -v r="$RANDOM" 'BEGIN { printf "%.3f", 0.3 + (r % 1700) / 1000 }')
    when="after ${delay}s"
  else
    target=${targets[$(( (t / 2 - 1) % 4 ))]} delay=""
    when="at phase $target"
  fi
  MESHTENSOR_CHECKPOINT_TRACE=1 MESHTENSOR_CHECKPOINT_PAUSE_AT=$target \
    setsid "$mpiexec" -n 2 "$tool" "$loop" "$dir" 1000 16 >/dev/null 2>"$trace" &
  pid=$!
  if [ -n "$delay" ]; then
    sleep "$delay"
  else
    # Up to a minute: beside other tests a loaded machine may take long to reach the phase.
    for _ in $(seq 600); do grep -q "^checkpoint: $target " "$trace" && break; sleep 0.1; done
    # A held write: the job goes on for a second (its next values, its polls), so a save published
    # before its bytes are on disk would be current when the kill comes.
    if [ "$target" = writing ]; then sleep 1; fi
  fi
  kill -KILL -- "-$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  pkill -KILL -f "$tool $loop $dir" 2>/dev/null || true
  phase=$(grep "^checkpoint: " "$trace" | tail -n 1 | awk "{print \$2}" || true)
  phase=${phase:-before-first-save}
  phases[$phase]=$(( ${phases[$phase]:-0} + 1 ))
  ranks=$(( (t % 3 == 0) ? 1 : (t % 3 == 1 ? 2 : 4) ))
  if ! out=$(run "$ranks" verify "$dir" 2>&1); then
    echo "trial $t: killed $when (last phase: $phase): the current checkpoint does not load:"
    echo "$out"
    exit 1
  fi
  step=$(echo "$out" | sed -n 's/.*: step \([0-9]*\),.*/\1/p')
  if [ -z "$step" ] || [ "$step" -lt "$last_step" ]; then
    echo "trial $t: the current checkpoint went back from step $last_step to '$step': $out"
    exit 1
  fi
  last_step=$step
  echo "trial $t: killed $when, last phase '$phase'; $out"
done
echo "kills per phase of the save:"
for p in "${!phases[@]}"; do echo "  $p: ${phases[$p]}"; done
for p in "${targets[@]}"; do
  if [ -z "${phases[$p]:-}" ]; then echo "no kill landed in phase '$p' of the save"; exit 1; fi
done
echo "all $trials kills left a loadable checkpoint (last step $last_step)"
