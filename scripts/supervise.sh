#!/usr/bin/env bash
# supervise.sh: run an MPI training job and, when it ends abnormally, start it again from its
# latest complete checkpoint (docs/checkpoints.md, "Restarting after a failure").
#
#   scripts/supervise.sh [--restarts N] [--checkpoint DIR] [--log FILE] [--delay S] -- mpiexec -n 4 prog ARGS...
#
# The command runs as given. Exit status 0: done. Any other end (a rank killed, MPI_Abort, the
# collective watchdog of MESHTENSOR_COLLECTIVE_TIMEOUT, a non-zero exit) is a failure: if DIR holds
# a complete checkpoint (DIR/latest names an existing checkpoint directory), the same command runs
# again with `--resume DIR` appended (any --resume it had removed), else as given, from scratch; at
# most N times (default 3), then the supervisor exits with the job's last status. The job's stdout
# and stderr pass through unchanged; the supervisor's own lines go to stderr (and FILE), one per
# restart naming the cause, read from the job's stderr and exit status:
#
#   supervise: restart 1/3 after: rank 2 exited on signal 9 (Killed)
#   supervise: resuming from ckpt/step-00000040 (step 40)
#   supervise: restart 2/3 after: meshtensor: collective watchdog: ...
#
# DIR defaults to the value of the command's own --checkpoint option. SIGINT, SIGTERM or SIGHUP to
# the supervisor stops the job (SIGTERM to mpiexec, which ends every rank) and restarts nothing.
#
# The scheduler's warning (docs/cluster.md): SIGUSR1 or SIGUSR2 to the supervisor is passed on to the
# job (mpiexec, mpirun and srun pass both on to every rank), and nothing else is done. A job that
# stops on such a signal after saving its checkpoint exits with status 85 (meshtensor's
# stopped_exit_code, runtime/stop_request.hpp): the supervisor does not restart it; with --requeue,
# inside a Slurm job, it asks Slurm to requeue the job (`scontrol requeue $SLURM_JOB_ID`), which
# runs the batch script again later (examples/slurm/train.sbatch resumes from the checkpoint). It
# exits 85 either way.
set -uo pipefail

usage() {
  cat <<'EOF'
Usage: supervise.sh [OPTIONS] [--] COMMAND [ARGS...]

Runs COMMAND (e.g. mpiexec -n 4 meshtensor-lm --checkpoint ckpt --save-every 100 ...). When it
ends abnormally (non-zero exit status: a rank killed by a signal, MPI_Abort, the collective
watchdog), runs it again with `--resume DIR` appended if DIR holds a complete checkpoint, or as
given if not, up to N times. Exits with the job's last status (0 once it completes).

Options:
  --restarts N       restart at most N times (default 3)
  --checkpoint DIR   checkpoint directory to resume from (default: the value of COMMAND's own
                     --checkpoint option; without one, every restart starts from scratch)
  --log FILE         also append the supervisor's lines, with date and time, to FILE
  --delay SECONDS    wait this long before each restart (default 0)
  --requeue          when the job stops on a signal with its checkpoint saved (exit status 85),
                     requeue this Slurm job: scontrol requeue $SLURM_JOB_ID
  -h, --help         print this help and exit

The job's output passes through. The supervisor prints to stderr one line per restart naming the
cause, e.g. `supervise: restart 1/3 after: rank 2 exited on signal 9 (Killed)`, and the checkpoint
it resumes from. SIGINT/SIGTERM/SIGHUP stop the job and the supervisor without a restart.
SIGUSR1/SIGUSR2 are passed on to the job (a scheduler's warning); a job that then saves a checkpoint
and exits with status 85 is not restarted, but requeued with --requeue, and the supervisor exits 85.
EOF
}

die() { echo "supervise: $*" >&2; echo "Run with --help for usage." >&2; exit 2; }

restarts=3 ckpt="" logfile="" delay=0 requeue=0
# The job's exit status after it stopped on a signal with its checkpoint saved (stop_request.hpp).
stopped_status=85
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --restarts) [ $# -ge 2 ] || die "--restarts needs a value"; restarts=$2; shift 2 ;;
    --restarts=*) restarts=${1#*=}; shift ;;
    --checkpoint) [ $# -ge 2 ] || die "--checkpoint needs a value"; ckpt=$2; shift 2 ;;
    --checkpoint=*) ckpt=${1#*=}; shift ;;
    --log) [ $# -ge 2 ] || die "--log needs a value"; logfile=$2; shift 2 ;;
    --log=*) logfile=${1#*=}; shift ;;
    --delay) [ $# -ge 2 ] || die "--delay needs a value"; delay=$2; shift 2 ;;
    --delay=*) delay=${1#*=}; shift ;;
    --requeue) requeue=1; shift ;;
    --) shift; break ;;
    -*) die "unknown option '$1'" ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || die "no command to run"
[[ $restarts =~ ^[0-9]+$ ]] || die "--restarts wants a non-negative integer, not '$restarts'"
[[ $delay =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--delay wants seconds, not '$delay'"
command=("$@")
# The job reads the supervisor's stdin (mpiexec passes it to rank 0); a closed one becomes /dev/null.
if ! { : 3<&0; } 2>/dev/null; then exec </dev/null; fi

# DIR from the command's own --checkpoint DIR / --checkpoint=DIR when not given.
if [ -z "$ckpt" ]; then
  for ((i = 0; i < ${#command[@]}; i++)); do
    case ${command[i]} in
      --checkpoint) ckpt=${command[i + 1]:-} ;;
      --checkpoint=*) ckpt=${command[i]#*=} ;;
    esac
  done
fi

log() {
  echo "supervise: $*" >&2
  if [ -n "$logfile" ]; then echo "$(date '+%Y-%m-%d %H:%M:%S') supervise: $*" >>"$logfile"; fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/supervise.XXXXXX") || exit 1
job="" tee_err="" stop_signal="" warned=""
cleanup() { rm -rf "$work"; }
trap cleanup EXIT
on_signal() {
  stop_signal=$1
  if [ -n "$job" ]; then kill -TERM "$job" 2>/dev/null; fi
}
trap 'on_signal INT' INT
trap 'on_signal TERM' TERM
trap 'on_signal HUP' HUP
# A scheduler's warning: passed on, the job decides (it saves and exits 85, or ignores it).
on_warning() {
  warned=$1
  log "SIG$1 received: passed on to the job"
  if [ -n "$job" ]; then kill "-$1" "$job" 2>/dev/null; fi
}
trap 'on_warning USR1' USR1
trap 'on_warning USR2' USR2

# run ARGS...: runs the job, its stderr (where mpiexec, MPI_Abort and meshtensor's errors write)
# also copied to $work/err; sets status. Its stdout passes straight through.
run() {
  rm -f "$work/err" "$work/err.fifo"
  mkfifo "$work/err.fifo"
  tee "$work/err" <"$work/err.fifo" >&2 &
  tee_err=$!
  # Explicit stdin: a background job's stdin would otherwise be /dev/null.
  "$@" <&0 2>"$work/err.fifo" &
  job=$!
  if [ -n "$stop_signal" ]; then kill -TERM "$job" 2>/dev/null; fi
  # wait returns early when a trapped signal arrives; wait again until the job has ended.
  while :; do
    # (braces: bash's own "Killed" notice for a job that died on a signal goes nowhere)
    { wait "$job"; } 2>/dev/null
    status=$?
    kill -0 "$job" 2>/dev/null || break
  done
  job=""
  wait "$tee_err"
}

# cause: one line naming why the job ended, from its output and $status.
cause() {
  local out=("$work/err") line
  # meshtensor's collective watchdog (MESHTENSOR_COLLECTIVE_TIMEOUT): its first line, as printed.
  line=$(grep -h -m 1 -o 'meshtensor: collective watchdog:.*' "${out[@]}" 2>/dev/null | head -n 1)
  if [ -n "$line" ]; then echo "$line"; return; fi
  # Open MPI: "mpiexec noticed that process rank 1 with PID 0 on node h exited on signal 9 (Killed)."
  line=$(grep -h -m 1 -E 'noticed that process rank [0-9]+ .*exited on signal [0-9]+' "${out[@]}" 2>/dev/null | head -n 1)
  if [ -n "$line" ]; then
    sed -E 's/.*process rank ([0-9]+) .*exited on signal ([0-9]+)( \(([^)]*)\))?.*/rank \1 exited on signal \2 (\4)/; s/ \(\)$//' <<<"$line"
    return
  fi
  # meshtensor's own last words on a rank that failed alone (docs/design/faults.md, "No rank is
  # ever left waiting").
  line=$(grep -h -m 1 -o 'meshtensor: rank [0-9]*: .*' "${out[@]}" 2>/dev/null | head -n 1)
  if [ -n "$line" ]; then echo "$line (exit status $status)"; return; fi
  # Open MPI: "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD\nwith errorcode 75."
  line=$(grep -h -A 1 -m 1 'MPI_ABORT was invoked on rank' "${out[@]}" 2>/dev/null | tr '\n' ' ')
  if [ -n "$line" ]; then
    sed -E 's/.*MPI_ABORT was invoked on rank ([0-9]+) in communicator ([^ ]+).*with errorcode (-?[0-9]+).*/rank \1 called MPI_Abort on \2 with error code \3/' <<<"$line"
    return
  fi
  # Open MPI: "Process name: [[63011,1],1]" then "Exit code: 3".
  line=$(grep -h -A 1 -m 1 -E 'Process name: +\[\[[0-9]+,[0-9]+\],[0-9]+\]' "${out[@]}" 2>/dev/null | tr '\n' ' ')
  if [[ $line =~ \[\[[0-9]+,[0-9]+\],([0-9]+)\].*Exit\ code:\ *(-?[0-9]+) ]]; then
    echo "rank ${BASH_REMATCH[1]} exited with status ${BASH_REMATCH[2]}"
    return
  fi
  if [ "$status" -gt 128 ] && name=$(kill -l "$((status - 128))" 2>/dev/null); then
    echo "exit status $status (the command ended on signal $((status - 128)), SIG$name)"
  else
    echo "exit status $status"
  fi
}

# checkpoint: the current checkpoint's directory if $ckpt holds a complete one (io::checkpoints
# writes `latest` last, atomically, naming a directory already whole).
checkpoint() {
  local name
  [ -n "$ckpt" ] && [ -f "$ckpt/latest" ] || return 1
  name=$(head -n 1 "$ckpt/latest")
  [ -n "$name" ] && [ -d "$ckpt/$name" ] && [ -n "$(ls -A "$ckpt/$name")" ] || return 1
  echo "$ckpt/$name"
}

# stopped WHY: the job will not be restarted here: logged, requeued with --requeue, exit 85.
stopped() {
  log "$1; not restarted"
  if [ "$requeue" = 1 ]; then
    if [ -z "${SLURM_JOB_ID:-}" ]; then
      log "--requeue: not inside a Slurm job (no SLURM_JOB_ID), nothing to requeue"
    elif ! command -v scontrol >/dev/null; then
      log "--requeue: no scontrol command in PATH, cannot requeue Slurm job $SLURM_JOB_ID"
    else
      # Read before the requeue: Slurm then sends SIGTERM to the job's processes, and a command
      # substitution's subshell does not keep this shell's traps.
      local at out status=0
      at=$(checkpoint) || at="scratch (no complete checkpoint in ${ckpt:-an unnamed directory})"
      out=$(scontrol requeue "$SLURM_JOB_ID" 2>&1) || status=$?
      # Slurm answers an accepted requeue by ending the job's processes, and at times scontrol is
      # one of them before it returns: killed by a signal (status above 128), saying nothing. Seen
      # under load as "scontrol requeue 1 failed: " while Slurm requeued the job.
      if [ "$status" -eq 0 ] || { [ "$status" -gt 128 ] && [ -z "$out" ]; }; then
        log "requeued Slurm job $SLURM_JOB_ID (scontrol requeue); it will resume from $at"
      else
        log "scontrol requeue $SLURM_JOB_ID failed (status $status): $out"
      fi
    fi
  fi
  exit "$stopped_status"
}

current=("${command[@]}")
restarted=0
while :; do
  run "${current[@]}"
  if [ -n "$stop_signal" ]; then
    log "stopped by SIG$stop_signal (the job's exit status: $status); no restart"
    exit $((128 + $(kill -l "$stop_signal")))
  fi
  if [ "$status" -eq 0 ]; then
    if [ "$restarted" -gt 0 ]; then log "the job completed after $restarted restart(s)"; fi
    exit 0
  fi
  if [ "$status" -eq "$stopped_status" ]; then
    stopped "the job stopped on a signal with its checkpoint saved (exit status $status${warned:+, after SIG$warned})"
  fi
  # Warned, then ended otherwise (a job that does not catch the signal dies of it): time is short,
  # so no restart here; a requeue resumes from the latest complete checkpoint.
  if [ -n "$warned" ]; then stopped "the job ended after SIG$warned: $(cause)"; fi
  why=$(cause)
  if [ "$restarted" -ge "$restarts" ]; then
    log "giving up after $restarted restart(s): the job ended abnormally again: $why"
    exit "$status"
  fi
  restarted=$((restarted + 1))
  log "restart $restarted/$restarts after: $why"
  if dir=$(checkpoint); then
    # The command without any --resume of its own, then --resume DIR.
    current=()
    skip=0
    for arg in "${command[@]}"; do
      if [ "$skip" = 1 ]; then skip=0; continue; fi
      case $arg in
        --resume) skip=1; continue ;;
        --resume=*) continue ;;
      esac
      current+=("$arg")
    done
    current+=(--resume "$ckpt")
    step=$(basename "$dir" | sed -nE 's/^step-0*([0-9]+).*/\1/p')
    log "resuming from $dir (step ${step:-0})"
  else
    current=("${command[@]}")
    if [ -n "$ckpt" ]; then
      log "no complete checkpoint in $ckpt: starting from scratch"
    else
      log "no checkpoint directory (neither --checkpoint nor the command's --checkpoint): starting from scratch"
    fi
  fi
  if [ "$delay" != 0 ]; then sleep "$delay" & wait $!; fi
  if [ -n "$stop_signal" ]; then log "stopped by SIG$stop_signal before restart $restarted; no restart"; exit $((128 + $(kill -l "$stop_signal"))); fi
  if [ -n "$warned" ]; then stopped "SIG$warned came before restart $restarted"; fi
done
