# shellcheck shell=bash
# Shared by the tests that start a cluster of their own on this machine and must end it whatever
# happens (tests/slurm/slurm_test.sh, tests/multihost/multihost_test.sh); sourced, not run. What
# each cluster is, and how it ends, stays in its script: the END command of cluster_traps.

# cluster_deadline VAR: the run ends within VAR's seconds (default 150) from now; left and limited
# keep to it and name VAR when it passes.
cluster_deadline() {
  cluster_deadline_var=$1
  deadline=$((SECONDS + ${!1:-150}))
}

# cluster_traps NAME END: from here on, every exit of the script (its end, a failure, HUP, INT, PIPE
# or TERM: "NAME: interrupted, cleaning up") sends SIGTERM to the command limited waits on, runs END
# (a command: the cluster's end) and keeps the exit status. File descriptor 3 is the script's
# standard output, for messages from inside redirected commands.
cluster_traps() {
  cluster_name=$1 cluster_end=$2 child=""
  exec 3>&1
  trap cluster_cleanup EXIT
  trap 'echo "$cluster_name: interrupted, cleaning up" >&3; exit 143' HUP INT PIPE TERM
}
cluster_cleanup() {
  local rc=$?
  trap - EXIT HUP INT PIPE TERM
  if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
  "$cluster_end"
  exit "$rc"
}

# Seconds left to the deadline.
left() { echo $((deadline - SECONDS)); }
# limited CMD...: CMD in the background (so that SIGTERM reaches the trap at once), ended at the deadline.
limited() {
  local t rc=0
  t=$(left)
  if [ "$t" -le 5 ]; then echo "FAILED: out of time ($cluster_deadline_var) before: $*" >&3; exit 1; fi
  timeout -k 5 "$t" "$@" &
  child=$!
  wait "$child" || rc=$?
  child=""
  [ "$rc" != 124 ] && [ "$rc" != 137 ] || echo "FAILED: out of time ($cluster_deadline_var): $*" >&3
  return "$rc"
}
