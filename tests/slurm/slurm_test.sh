#!/usr/bin/env bash
# slurm_test.sh launch|requeue-srun|requeue-mpirun MPIEXEC LM SUPERVISE SBATCH WORKDIR
#
# A Slurm cluster of two nodes on this machine, started and stopped by the test
# (tests/slurm/CMakeLists.txt; docs/cluster.md): Debian's slurmctld and two slurmd (NodeName
# <id>n1 and <id>n2, each with its own port and spool directory, each in a UTS namespace of its own
# so that its processes see the node's hostname, as Open MPI's shared-memory files, named after the
# hostname, need), AuthType=auth/none (no munge daemon), everything under WORKDIR. Jobs of 4 ranks,
# 2 per node, of meshtensor-lm (tools/lm; --layout 2d --mesh 2 2, dropout 0.1):
#
#   launch   the losses of 8 steps launched by `srun --mpi=pmix` and by Open MPI's `mpirun` inside
#            `salloc` equal those of the plain `MPIEXEC -n 4` run bit for bit (17 digits); the ranks
#            land 2 on each node.
#   requeue-srun, requeue-mpirun
#            the job of SBATCH (examples/slurm/train.sbatch, under SUPERVISE; its ranks started by
#            srun --mpi=pmix, or by Open MPI's mpirun inside the allocation) gets Slurm's warning
#            signal, SIGUSR1 to the batch shell (`scancel --batch --signal=USR1`: what
#            `--signal=B:USR1@T` sends when T seconds are left), after step 3 of 30: the ranks stop
#            together after a step, save a checkpoint, exit 85; the supervisor requeues the job,
#            Slurm runs it again, it resumes, and ends with the final checkpoint of an
#            uninterrupted mpiexec run byte for byte and the same losses for the steps it trained.
#
# Exit 77 (ctest's SKIP_RETURN_CODE) with "SKIPPED: <why>" where it cannot run: not root, no Slurm
# (Debian: slurmctld, slurmd, slurm-client; scripts/install_deps.sh installs them), no
# `unshare --uts`, not Open MPI, or Slurm without its PMIx plugin (srun --mpi=list). The daemons and
# every process they started are ended on exit, failure, SIGINT and SIGTERM; those of a run killed
# with SIGKILL by the next run. The whole run ends within MESHTENSOR_SLURM_DEADLINE seconds
# (default 150). MESHTENSOR_SLURM_SKIP=<reason> skips on purpose (to test the skip path).
set -euo pipefail

case ${1:-} in launch | requeue-srun | requeue-mpirun) ;; *) set -- ;; esac
if [ $# -ne 6 ]; then
  echo "usage: $0 launch|requeue-srun|requeue-mpirun MPIEXEC LM SUPERVISE SBATCH WORKDIR" >&2
  exit 2
fi
mode=$1 mpiexec=$2 lm=$3 supervise=$4 sbatch_script=$5 work=$6
# shellcheck source-path=SCRIPTDIR source=../cluster_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster_common.sh"
cluster_deadline MESHTENSOR_SLURM_DEADLINE
skip() { echo "SKIPPED: slurm test ($mode): $*"; exit 77; }

# ---- What the machine allows ------------------------------------------------------------------------
[ -z "${MESHTENSOR_SLURM_SKIP:-}" ] || skip "MESHTENSOR_SLURM_SKIP is set: $MESHTENSOR_SLURM_SKIP"
[ "$(id -u)" = 0 ] || skip "not root (uid $(id -u)): slurmd runs jobs as their users and needs root"
for c in slurmctld slurmd; do
  command -v "$c" >/dev/null || [ -x "/usr/sbin/$c" ] || skip "no '$c' (Debian: slurmctld, slurmd; scripts/install_deps.sh)"
done
export PATH="$PATH:/usr/sbin"
for c in srun salloc sbatch scontrol squeue scancel sinfo; do
  command -v "$c" >/dev/null || skip "no '$c' (Debian: slurm-client; scripts/install_deps.sh)"
done
for c in unshare timeout; do command -v "$c" >/dev/null || skip "no '$c' command (Debian: util-linux, coreutils)"; done
"$mpiexec" --version 2>&1 | grep -q -e "Open MPI" -e OpenRTE || skip "'$mpiexec' is not Open MPI's"
err=$(unshare --uts sh -c 'hostname mtsl-probe && [ "$(hostname)" = mtsl-probe ]' 2>&1) ||
  skip "cannot give a node its own hostname (unshare --uts): $err"

# ---- The cluster --------------------------------------------------------------------------------------
prefix=mtsl
id=$prefix$$
node1=${id}n1 node2=${id}n2
# The processes of a cluster carry its marker in their environment (slurmd passes its own on to
# slurmstepd and the job): those of this run are ended at exit, those of a run that was killed
# before its trap (its script gone) at the next start.
marker=MESHTENSOR_SLURM_TEST_RUN
procs_of() {           # PIDs whose environment has marker=$1, but this script and its subshells
  local f p
  for f in $(grep -l -s -z -x -F "$marker=$1" /proc/[0-9]*/environ); do
    p=${f#/proc/}
    p=${p%/environ}
    grep -q slurm_test "/proc/$p/cmdline" 2>/dev/null || echo "$p"
  done
  return 0
}
end_run() {            # every process of run $1: daemons, steps and ranks, at once
  local pids
  pids=$(procs_of "$1")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}
for run in $(grep -h -s -z -o "^$marker=${prefix}[0-9]*\$" /proc/[0-9]*/environ | tr '\0' '\n' | sed "s/^$marker=//" | sort -u); do
  pid=${run#"$prefix"}
  if [ "$pid" != $$ ] && { ! kill -0 "$pid" 2>/dev/null || ! grep -q slurm_test "/proc/$pid/cmdline" 2>/dev/null; }; then
    echo "ending the processes of an earlier run, $run (its script, process $pid, is gone)"
    end_run "$run"
  fi
done

# The nodes' spool and temporary directories under a short path: slurmstepd binds a Unix socket
# in the spool directory (<spool>/<node>_<job>.<step>), and a socket path has at most 108 bytes; one
# under a deep build tree exceeded it (110), and the job's launch failed.
nodes=$(mktemp -d "${TMPDIR:-/tmp}/mtsl.XXXXXX")
end_cluster() {
  end_run "$id"
  rm -f /dev/shm/vader_segment."$id"* 2>/dev/null || true   # Open MPI's, of ranks killed here
  rm -rf "$nodes"
}
cluster_traps "slurm test" end_cluster

rm -rf "$work"
mkdir -p "$work/state" "$nodes/spool-$node1" "$nodes/spool-$node2" "$nodes/tmp-$node1" "$nodes/tmp-$node2"
socket="$nodes/spool-$node1/${node1}_4294967295.4294967291"
[ "${#socket}" -le 107 ] || skip "the nodes' directories under ${TMPDIR:-/tmp} are too deep for slurmstepd's sockets (${#socket} > 107 bytes)"
# Ports: from this run's PID (another run, in another build tree, may hold others), below the
# kernel's ephemeral range (outgoing connections take ports there at any moment: a CI run lost a
# slurmd to one) and free in every state, listening or not (ss; /dev/tcp where ss is missing).
ephemeral_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
port_span=$(((ephemeral_low - 20000) / 4))
[ "$port_span" -ge 16 ] || skip "the ephemeral port range starts at $ephemeral_low: no room for the nodes' ports below it"
ports_free() {
  local p
  for p in "$@"; do
    if command -v ss >/dev/null; then
      [ -z "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ] || return 1
    elif (exec 9<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      return 1
    fi
  done
}
slot=$(($$ % port_span))
for _ in 1 2 3 4 5 6 7 8; do
  base=$((20000 + slot * 4))
  ports_free "$base" $((base + 1)) $((base + 2)) && break
  slot=$(((slot + 1) % port_span))
done
ports_free "$base" $((base + 1)) $((base + 2)) || skip "no three free TCP ports found near $base"

# auth/none and cred/none: Slurm 22.05 still has them (23.02 dropped them); no munge daemon to start.
# TmpFS and the spool directories per node (%n): PMIx's client directories would collide otherwise.
# cred_expire=5: a requeued job may start 5 s after its requeue (default 120). sched_interval=1:
# the scheduler looks at pending jobs every second.
cat >"$work/slurm.conf" <<CONF
ClusterName=$id
SlurmctldHost=localhost
SlurmctldPort=$base
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
StateSaveLocation=$work/state
SlurmdSpoolDir=$nodes/spool-%n
TmpFS=$nodes/tmp-%n
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd-%n.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd-%n.log
MailProg=/bin/true
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
NodeName=$node1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 1)) CPUs=2 State=UNKNOWN
NodeName=$node2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + 2)) CPUs=2 State=UNKNOWN
PartitionName=$id Nodes=$node1,$node2 Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$work/slurm.conf "$marker=$id"
# Open MPI: every rank shares this machine's 2 cores, which the nodes' CPUs=2 hide from it (ranks
# would busy-poll); all traffic over the loopback interface, the nodes' one network.
export OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_oob_tcp_if_include=lo
unset SLURM_JOB_ID SLURM_JOBID   # a test run inside a Slurm job of its own must not talk to that one

# (disowned: their end at cleanup, by SIGKILL, is no news)
slurmctld -D -i -f "$work/slurm.conf" >"$work/slurmctld.out" 2>&1 &
disown
for n in "$node1" "$node2"; do
  unshare --uts sh -c 'hostname "$1" && exec slurmd -D -N "$1" -f "$2"' sh "$n" "$work/slurm.conf" >"$work/slurmd-$n.out" 2>&1 &
  disown
done
for _ in $(seq 100); do
  [ "$(sinfo -h -o '%t' 2>/dev/null | tr -d '\n')" = idle ] && [ "$(sinfo -h -o '%D' 2>/dev/null)" = 2 ] && break
  sleep 0.2
done
if [ "$(sinfo -h -o '%D %t' 2>/dev/null)" != "2 idle" ]; then
  echo "FAILED: the two nodes did not come up idle within 20 s: sinfo says '$(sinfo -h -o '%D %t' 2>&1)'"
  for f in "$work"/slurmctld.out "$work"/slurmd-*.out "$work"/slurmctld.log "$work"/slurmd-*.log; do
    [ -f "$f" ] && { echo "--- $f"; tail -n 15 "$f"; }
  done
  exit 1
fi
# srun --mpi=list: "MPI plugin types are...", then one indented name a line, then a line on PMIx versions.
mpis=$(srun --mpi=list 2>&1 | sed -n 's/^[[:space:]]\+//p' | tr '\n' ' ' | sed 's/ $//')
echo "Slurm $(sinfo --version | awk '{print $2}'), nodes $node1 and $node2 idle (ports $base..$((base + 2))); srun --mpi=list: $mpis"
case " $mpis " in *" pmix "*) ;; *) skip "this Slurm has no PMIx plugin (srun --mpi=list: $mpis): srun cannot start Open MPI's ranks" ;; esac

# ---- Helpers -------------------------------------------------------------------------------------------
# (left and limited: tests/cluster_common.sh)
# run LOG CMD...: its output into WORKDIR/LOG.log, shown if it fails.
run() {
  local log=$work/$1.log
  shift
  if ! limited "$@" >"$log" 2>&1; then
    echo "FAILED: $*"
    sed 's/^/  | /' "$log"
    exit 1
  fi
}
ok() { echo "ok [${SECONDS} s]: $*"; }
# SLURM_LM_JOB: how the 4 ranks train (default --layout 2d --mesh 2 2; slurm.requeue.pipeline: 2
# pipeline stages of [2 x 1], its checkpoint a shard per stage).
read -r -a lm_job <<<"${SLURM_LM_JOB:---layout 2d --mesh 2 2}"
lm_args=("${lm_job[@]}" --dropout 0.1 --log-every 1)

if [ "$mode" = launch ]; then
  # ---- Where srun puts the ranks ---------------------------------------------------------------------
  run where srun -N 2 -n 4 sh -c 'echo "task $SLURM_PROCID on $(hostname)"'
  for n in "$node1" "$node2"; do
    [ "$(grep -c " on $n\$" "$work/where.log")" = 2 ] || { echo "FAILED: not 2 tasks on $n:"; cat "$work/where.log"; exit 1; }
  done
  ok "srun -N 2 -n 4: 2 tasks on each node ($node1, $node2), each node with its own hostname"

  few=(--steps 8)
  run mpiexec "$mpiexec" -n 4 "$lm" "${lm_args[@]}" "${few[@]}" --csv "$work/mpiexec.csv"
  run srun srun --mpi=pmix -N 2 -n 4 --kill-on-bad-exit=1 "$lm" "${lm_args[@]}" "${few[@]}" --csv "$work/srun.csv"
  run salloc salloc -N 2 -n 4 mpirun "$lm" "${lm_args[@]}" "${few[@]}" --csv "$work/mpirun.csv"
  [ "$(wc -l <"$work/mpiexec.csv")" = 9 ] || { echo "FAILED: no 8 losses in $work/mpiexec.csv"; exit 1; }
  for l in srun mpirun; do
    if ! diff "$work/mpiexec.csv" "$work/$l.csv"; then
      echo "FAILED: the losses of the run started by $l differ from mpiexec's (mpiexec <, $l >)"
      exit 1
    fi
  done
  ok "meshtensor-lm, 4 ranks on 2 nodes, 8 steps: the losses under srun --mpi=pmix and under mpirun inside salloc equal mpiexec's bit for bit (step 8: $(tail -n 1 "$work/srun.csv"))"
  # Open MPI without Slurm's PMI-2: what a wrong --mpi looks like (reported, not asserted).
  limited srun --mpi=pmi2 -N 1 -n 1 "$lm" --steps 1 >"$work/pmi2.log" 2>&1 || true
  echo "srun --mpi=pmi2 (reported, not asserted): $(grep -m 1 -e 'not built with SLURM' -e 'PMI' "$work/pmi2.log" | sed 's/^ *//' || echo '(no PMI message)')"
  echo "slurm test (launch): all checks passed in ${SECONDS} s"
  exit 0
fi

# ---- requeue ---------------------------------------------------------------------------------------------
launcher=${mode#requeue-}
steps=30 warn_after=3
run reference "$mpiexec" -n 4 "$lm" "${lm_args[@]}" --steps "$steps" --save-every "$steps" \
  --checkpoint "$work/reference/ckpt" --csv "$work/reference.csv"
ok "the uninterrupted run: $steps steps under mpiexec, its checkpoint $(cat "$work/reference/ckpt/latest")"

out=$work/job.out
jid=$(sbatch --parsable -N 2 --ntasks-per-node=2 --time=5 -o "$out" --export=ALL,MESHTENSOR_SUPERVISE="$supervise",MESHTENSOR_LAUNCHER="$launcher" \
        "$sbatch_script" "$lm" "${lm_args[@]}" --steps "$steps" --save-every "$steps" \
        --checkpoint "$work/ckpt" --csv "$work/job.csv")
echo "submitted $sbatch_script as job $jid, its ranks started by $launcher"
state() { scontrol show job "$jid" 2>/dev/null | grep -o -E 'JobState=[A-Z_]+|Restarts=[0-9]+' | tr '\n' ' '; }
fail() { echo "FAILED: $* (job $jid: $(state))"; echo "--- the job's output:"; sed 's/^/  | /' "$out" 2>/dev/null; exit 1; }
until grep -q -E "^step +$warn_after/" "$out" 2>/dev/null; do
  [ "$(left)" -gt 5 ] || fail "the job did not reach step $warn_after"
  case $(state) in *PENDING* | *RUNNING* | *CONFIGURING*) ;; *) fail "the job ended before step $warn_after" ;; esac
  sleep 0.1
done
# As --signal=B:USR1@T does T seconds before the time limit: SIGUSR1 from slurmd to the batch shell.
scancel --batch --signal=USR1 "$jid"
ok "job $jid reached step $warn_after: SIGUSR1 sent to its batch shell (scancel --batch --signal=USR1)"
until scontrol show job "$jid" 2>/dev/null | grep -q -E 'JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE|PREEMPTED)'; do
  [ "$(left)" -gt 5 ] || fail "the job did not end"
  sleep 0.2
done
st=$(state)
case $st in *JobState=COMPLETED*Restarts=1*) ;; *) fail "the job did not complete after exactly one requeue" ;; esac
stop_line=$(grep -m 1 -E '^stopped on SIGUSR1 after step [0-9]+ of' "$out") || fail "no rank said it stopped on SIGUSR1"
stopped_at=$(sed -E 's/.*after step ([0-9]+) of.*/\1/' <<<"$stop_line")
[ "$stopped_at" -ge "$warn_after" ] && [ "$stopped_at" -lt "$steps" ] || fail "stopped after step $stopped_at, not in $warn_after..$((steps - 1))"
grep -q -E "^saved checkpoint $work/ckpt/step-0*$stopped_at\$" "$out" || fail "no checkpoint saved at step $stopped_at when stopping"
grep -q -E "^supervise: the job stopped on a signal with its checkpoint saved \(exit status 85, after SIGUSR1\)" "$out" ||
  fail "the supervisor did not see the job stop with status 85 after SIGUSR1"
grep -q -E "^supervise: requeued Slurm job $jid \(scontrol requeue\); it will resume from $work/ckpt/step-0*$stopped_at\$" "$out" ||
  fail "the supervisor did not requeue the job"
grep -q -E "^train.sbatch: job $jid run 2 on .*, $launcher\), resuming from $work/ckpt" "$out" || fail "Slurm did not run the job again"
grep -q -E "^resumed from $work/ckpt at step $stopped_at " "$out" || fail "the second run did not resume from step $stopped_at"
ok "$stop_line; exit status 85 through $launcher; the supervisor requeued job $jid; Slurm ran it again; it resumed at step $stopped_at and completed"

clean=$work/reference/ckpt/$(cat "$work/reference/ckpt/latest")
mine=$work/ckpt/$(cat "$work/ckpt/latest")
[ "$(basename "$clean")" = "$(basename "$mine")" ] || fail "the job's last checkpoint is $(basename "$mine"), the uninterrupted run's $(basename "$clean")"
for file in "$clean"/*.safetensors "$clean"/*.json; do  # model.safetensors, or the shards and their index
  [ -e "$file" ] || continue
  cmp "$file" "$mine/$(basename "$file")" || fail "the final checkpoint differs from the uninterrupted run's ($(basename "$file"))"
done
if ! diff <(sed -n "$((stopped_at + 2)),\$p" "$work/reference.csv") <(sed -n '2,$p' "$work/job.csv"); then
  fail "the losses of steps $((stopped_at + 1))..$steps after the requeue differ from the uninterrupted run's (uninterrupted <, requeued >)"
fi
ok "the requeued job's final checkpoint ($(basename "$mine")) equals the uninterrupted run's byte for byte; the losses of steps $((stopped_at + 1))..$steps are equal"
echo "slurm test (requeue): all checks passed in ${SECONDS} s"
