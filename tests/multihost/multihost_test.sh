#!/usr/bin/env bash
# multihost_test.sh HOSTS MPIEXEC MATMUL LM CKPT_TOOL WORKDIR [--latency]
#
# Several hosts on one machine (tests/multihost/CMakeLists.txt, docs: "Several hosts"): HOSTS Linux
# network namespaces, each with its own hostname (a UTS namespace per process started in it), joined
# by veth pairs to a bridge in a switch namespace of their own, on the private subnet 10.213.7.0/24.
# Open MPI is started in the first host and reaches the others through an rsh agent (generated into
# WORKDIR) that enters the node's namespaces; its processes talk TCP between hosts and shared memory
# (vader) inside each (btl tcp,vader,self; btl_tcp_if_include and oob_tcp_if_include the subnet).
#
# Checks, with HOSTS x 2 ranks (2 hosts: mesh [2 x 2]; 3 hosts: [2 x 3]):
#   - the ranks land on HOSTS distinct hostnames and network namespaces, 2 each, none the machine's;
#   - ranks on different hosts cannot talk without TCP (btl vader,self fails across hosts), and
#     Open MPI's bml (btl_base_verbose) sends by tcp exactly between hosts, by vader inside each;
#   - the matmul example prints what it prints on one host (its timing line aside);
#   - meshtensor-lm --layout 2d, 3 steps: losses equal the one-host run's bit for bit, bytes did go
#     through the veths, and its checkpoint (saved at step 3) equals the one-host checkpoint byte
#     for byte; resumed from it across the hosts, steps 4..5 equal the one-host uninterrupted run's;
#   - checkpoint_tool: two checkpoints saved across the hosts equal the one-host ones byte for byte
#     and load whole (verify) across the hosts and on one host.
# With --latency: tc netem delays every packet leaving a host by 1 ms; meshtensor-lm's median step
# time is printed on one host, across the hosts, and across them with the delay (reported, not
# asserted); the losses of the three must be equal bit for bit.
#
# Exit 77 (ctest's SKIP_RETURN_CODE) with "SKIPPED: <why>" where the machine does not allow it: not
# root, no `ip netns`, no veth or bridge, no `unshare --uts`, not Open MPI, or (--latency only) no
# sch_netem in the kernel. Every namespace, link and /etc/netns entry it made is removed on exit,
# failure, SIGINT or SIGTERM; those of an earlier run killed with SIGKILL (ctest's timeout) are
# removed by the next run. Each command is limited so that the whole run ends within
# MESHTENSOR_MULTIHOST_DEADLINE seconds (default 150), before ctest's TIMEOUT.
# MESHTENSOR_MULTIHOST_SKIP=<reason> skips on purpose (to test the skip path).
set -euo pipefail

if [ $# -lt 6 ] || { [ $# -eq 7 ] && [ "$7" != --latency ]; } || [ $# -gt 7 ]; then
  echo "usage: $0 HOSTS MPIEXEC MATMUL LM CKPT_TOOL WORKDIR [--latency]" >&2
  exit 2
fi
hosts=$1 mpiexec=$2 matmul=$3 lm=$4 tool=$5 work=$6 latency=${7:-}
case $hosts in 2 | 3 | 4) ;; *) echo "HOSTS must be 2, 3 or 4 (got '$hosts')" >&2; exit 2 ;; esac
per_host=2
ranks=$((hosts * per_host))
mesh=(2 "$hosts")
# shellcheck source-path=SCRIPTDIR source=../cluster_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/../cluster_common.sh"
cluster_deadline MESHTENSOR_MULTIHOST_DEADLINE

made_etc_netns=""   # /etc/netns is removed at the end if this run made it (or found it empty)
skip() {
  echo "SKIPPED: multihost test ($hosts hosts${latency:+, latency}): $*"
  [ -z "$made_etc_netns" ] || rmdir /etc/netns 2>/dev/null || true
  exit 77
}

# ---- What the machine allows (nothing is changed until all of it is known) -----------------------
[ -z "${MESHTENSOR_MULTIHOST_SKIP:-}" ] || skip "MESHTENSOR_MULTIHOST_SKIP is set: $MESHTENSOR_MULTIHOST_SKIP"
[ "$(id -u)" = 0 ] || skip "not root (uid $(id -u)): network namespaces, veth pairs and hostnames need root"
for c in ip unshare timeout; do
  command -v "$c" >/dev/null || skip "no '$c' command (Debian: iproute2, util-linux, coreutils)"
done
[ -z "$latency" ] || command -v tc >/dev/null || skip "no 'tc' command for the delay (Debian: iproute2)"
"$mpiexec" --version 2>&1 | grep -q -e "Open MPI" -e OpenRTE ||
  skip "'$mpiexec' is not Open MPI's (the hosts are reached through Open MPI's plm_rsh_agent)"
case $work in *[[:space:]]*) skip "WORKDIR '$work' holds white space (Open MPI splits plm_rsh_agent at it)" ;; esac
for f in "$matmul" "$lm" "$tool"; do [ -x "$f" ] || { echo "not an executable: $f" >&2; exit 2; }; done

prefix=mtmh            # every namespace of this script: mtmh<PID>-sw, mtmh<PID>-h<N>, mtmh<PID>-probe
id=$prefix$$
netns_of_run() { ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$1-" || true; }
kill_in_ns() {         # the processes left in namespace $1 (this script's)
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
}
remove_ns() {          # the processes left in it, its /etc/netns entry, the namespace
  local ns=$1
  kill_in_ns "$ns"
  ip netns delete "$ns" 2>/dev/null || true
  rm -rf "/etc/netns/$ns"
}

[ -n "$(ls -A /etc/netns 2>/dev/null)" ] || made_etc_netns=1
probe=$id-probe
if ! err=$(ip netns add "$probe" 2>&1); then
  skip "cannot create a network namespace (ip netns add: $err)"
fi
probe_fail=""
if ! err=$(ip -n "$probe" link add br0 type bridge 2>&1); then
  probe_fail="cannot create a bridge in a network namespace: $err"
elif ! err=$(ip -n "$probe" link add va type veth peer name vb 2>&1); then
  probe_fail="cannot create a veth pair: $err"
elif ! err=$(mkdir -p "/etc/netns/$probe" 2>&1); then
  probe_fail="cannot write /etc/netns (the hosts' /etc/hosts): $err"
elif ! err=$(ip netns exec "$probe" unshare --uts sh -c 'hostname mtmh-probe && [ "$(hostname)" = mtmh-probe ]' 2>&1); then
  probe_fail="cannot give a namespace its own hostname (unshare --uts): $err"
elif [ -n "$latency" ] && ! err=$(ip -n "$probe" link set va up 2>&1 &&
                                  ip netns exec "$probe" tc qdisc add dev va root netem delay 1ms 2>&1); then
  probe_fail="the kernel has no sch_netem for the 1 ms delay (tc qdisc add ... netem: ${err//$'\n'/ })"
fi
remove_ns "$probe"
[ -z "$probe_fail" ] || skip "$probe_fail"

# ---- The hosts ------------------------------------------------------------------------------------
# Namespaces of runs that were killed before their trap (SIGKILL): their script is gone.
for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+-" || true); do
  pid=${ns#"$prefix"}
  pid=${pid%%-*}
  if ! kill -0 "$pid" 2>/dev/null || ! grep -q multihost_test "/proc/$pid/cmdline" 2>/dev/null; then
    echo "removing namespace $ns of an earlier run (process $pid is gone)"
    remove_ns "$ns"
  fi
done

end_cluster() {
  for ns in $(netns_of_run "$id"); do remove_ns "$ns"; done
  [ -z "$made_etc_netns" ] || rmdir /etc/netns 2>/dev/null || true
}
cluster_traps "multihost test" end_cluster

rm -rf "$work"
mkdir -p "$work"
subnet=10.213.7
sw=$id-sw
node() { echo "$id-node$1"; }  # hostnames, unique to this run; the namespace of host N is $id-h$N
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
: >"$work/hosts"
{ echo "127.0.0.1 localhost"; for i in $(seq "$hosts"); do echo "$subnet.$i $(node "$i")"; done; } >"$work/etc_hosts"
for i in $(seq "$hosts"); do
  ns=$id-h$i
  ip netns add "$ns"
  # /etc/netns/NS/hosts is bind-mounted over /etc/hosts by `ip netns exec NS`: every host resolves the others
  mkdir -p "/etc/netns/$ns"
  cp "$work/etc_hosts" "/etc/netns/$ns/hosts"
  ip -n "$sw" link add "port$i" type veth peer name eth0 netns "$ns"
  ip -n "$sw" link set "port$i" master br0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$subnet.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  echo "$(node "$i") slots=$per_host" >>"$work/hosts"
done

# Open MPI's rsh agent: AGENT [OPTIONS] NODE COMMAND...: COMMAND (one shell line, as ssh gives it to
# the remote shell) in NODE's network namespace, under NODE's hostname.
agent=$work/rsh_agent
{
  echo '#!/bin/sh'
  echo 'while [ $# -gt 0 ]; do case $1 in -*) shift ;; *) break ;; esac; done'
  echo 'node=$1; shift'
  echo 'case $node in'
  for i in $(seq "$hosts"); do echo "  $(node "$i") | $subnet.$i) ns=$id-h$i; name=$(node "$i") ;;"; done
  echo '  *) echo "rsh_agent: unknown node '"'"'$node'"'"'" >&2; exit 255 ;;'
  echo 'esac'
  echo 'exec ip netns exec "$ns" unshare --uts sh -c '"'"'hostname "$0" && exec sh -c "$*"'"'"' "$name" "$@"'
} >"$agent"
chmod +x "$agent"

# (left and limited, which keep to the deadline: tests/cluster_common.sh)
# on_hosts N CMD...: CMD on N ranks across the hosts (mpiexec runs in the first host).
# The hosts share this machine's cores, which each host's slots do not show Open MPI: without
# mpi_yield_when_idle, its ranks poll without yielding and a step of meshtensor-lm takes 10x longer.
launch=(--hostfile "$work/hosts" --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 --mca mpi_yield_when_idle 1
        --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
btl=tcp,vader,self
on_hosts() {
  local n=$1
  shift
  limited ip netns exec "$id-h1" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$(node 1)" \
    "$mpiexec" "${launch[@]}" --mca btl "$btl" -n "$n" "$@"
}
on_one() { local n=$1; shift; limited "$mpiexec" -n "$n" "$@"; }
# run LOG on_hosts|on_one N CMD...: its output into WORKDIR/LOG.log, shown if it fails.
run() {
  local log=$work/$1.log
  shift
  if ! "$@" >"$log" 2>&1; then
    echo "FAILED: ${*:2}"
    sed 's/^/  | /' "$log"
    exit 1
  fi
}
ok() { echo "ok [${SECONDS} s]: $*"; }
veth_bytes() {        # bytes that went out of all hosts' eth0
  local sum=0 b
  for i in $(seq "$hosts"); do
    b=$(ip netns exec "$id-h$i" cat /sys/class/net/eth0/statistics/tx_bytes)
    sum=$((sum + b))
  done
  echo "$sum"
}

echo "hosts: $(for i in $(seq "$hosts"); do echo -n "$(node "$i") ($subnet.$i, netns $id-h$i) "; done)"
echo "$ranks ranks, $per_host per host; mesh [${mesh[0]} x ${mesh[1]}]"

# ---- Where the ranks land -------------------------------------------------------------------------
run where on_hosts "$ranks" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK on $(hostname) netns $(readlink /proc/self/ns/net)"'
grep '^rank ' "$work/where.log" | sort -n -k 2 | sed 's/^/  /'
own_host=$(hostname) own_net=$(readlink /proc/self/ns/net)
for i in $(seq "$hosts"); do
  count=$(grep -c " on $(node "$i") netns " "$work/where.log" || true)
  [ "$count" = "$per_host" ] || { echo "FAILED: $count ranks on $(node "$i"), not $per_host"; exit 1; }
done
names=$(awk '/^rank /{print $4}' "$work/where.log" | sort -u | wc -l)
nets=$(awk '/^rank /{print $6}' "$work/where.log" | sort -u | wc -l)
if [ "$names" != "$hosts" ] || [ "$nets" != "$hosts" ] || grep -q -e " on $own_host netns " -e " $own_net\$" "$work/where.log"; then
  echo "FAILED: the $ranks ranks are not on $hosts distinct hostnames and network namespaces (above)"
  exit 1
fi
ok "$ranks ranks on $hosts distinct hostnames and network namespaces, $per_host each"

if [ -n "$latency" ]; then
  # ---- Latency: 1 ms more on every packet that leaves a host ----------------------------------------
  steps=(--layout 2d --mesh "${mesh[@]}" --steps 20 --warmup 4 --log-every 1000)
  run lm_one on_one "$ranks" "$lm" "${steps[@]}" --csv "$work/one.csv"
  run lm_nodelay on_hosts "$ranks" "$lm" "${steps[@]}" --csv "$work/nodelay.csv"
  for i in $(seq "$hosts"); do ip netns exec "$id-h$i" tc qdisc add dev eth0 root netem delay 1ms; done
  run lm_delay on_hosts "$ranks" "$lm" "${steps[@]}" --csv "$work/delay.csv"
  delayed=$(ip netns exec "$id-h1" tc -s qdisc show dev eth0 | awk '/Sent/{print $4; exit}')
  tone=$(awk '/^step_time_median_ms/{print $2}' "$work/lm_one.log")
  t0=$(awk '/^step_time_median_ms/{print $2}' "$work/lm_nodelay.log")
  t1=$(awk '/^step_time_median_ms/{print $2}' "$work/lm_delay.log")
  echo "meshtensor-lm --layout 2d --mesh ${mesh[*]}, $ranks ranks on $hosts hosts, median step time over 16 steps:"
  echo "  one host (shared memory only):         ${tone:-?} ms"
  echo "  $hosts hosts, no delay:                     ${t0:-?} ms"
  echo "  $hosts hosts, netem delay 1 ms out of each: ${t1:-?} ms ($delayed packets through host 1's netem)"
  cmp -s "$work/one.csv" "$work/nodelay.csv" && cmp -s "$work/one.csv" "$work/delay.csv" ||
    { echo "FAILED: the losses differ between one host, the hosts, and the hosts with the delay"; exit 1; }
  ok "the losses on one host, across the hosts and with the delay are equal bit for bit (step times reported, not asserted)"
  exit 0
fi

# ---- TCP between the hosts: without it, ranks on different hosts cannot reach each other ----------
# Open MPI says so ("unable to reach each other") and aborts, but the job then hangs in Open MPI
# 4.1 (the other ranks wait in the collective): the message is awaited, then the job is stopped.
(btl=vader,self on_hosts "$ranks" "$matmul" --size 64 --mesh "${mesh[@]}" >"$work/no_tcp.log" 2>&1) &
child=$!
for _ in $(seq 150); do
  grep -qs "unable to reach each other" "$work/no_tcp.log" && break
  kill -0 "$child" 2>/dev/null || break
  sleep 0.2
done
pkill -TERM -P "$child" 2>/dev/null || true   # its `timeout`, which passes SIGTERM on to mpiexec
wait "$child" 2>/dev/null || true
child=""
for i in $(seq "$hosts"); do kill_in_ns "$id-h$i"; done
if ! grep -q "unable to reach each other" "$work/no_tcp.log" ||
   ! grep -q "BTLs attempted: vader self" "$work/no_tcp.log"; then
  echo "FAILED: with --mca btl vader,self, Open MPI did not say that ranks on different hosts cannot reach each other:"
  sed 's/^/  | /' "$work/no_tcp.log"
  exit 1
fi
ok "without the tcp btl, Open MPI finds no way between ranks on different hosts: $(grep -m 1 'is on host' "$work/no_tcp.log" | sed 's/^ *//'), $(grep -m 2 'is on host' "$work/no_tcp.log" | tail -n 1 | sed 's/^ *//')"

# Which way each pair took, as Open MPI's bml says ("[HOST:PID] mca: bml: Using tcp btl for send to
# [[JOB,1],RANK] on node NODE"): tcp exactly between hosts, vader inside each.
OMPI_MCA_btl_base_verbose=100 run btl_used on_hosts "$ranks" "$matmul" --size 64 --mesh "${mesh[@]}"
if ! summary=$(awk '/mca: bml: Using [a-z]+ btl for send to/ {
                      from = substr($1, 2); sub(/:.*/, "", from); to = $NF; btl = $5
                      if (btl == "self") next
                      if ((btl == "tcp") != (from != to)) { print "wrong btl: " $0; bad = 1 }
                      n[btl]++ }
                    END { if (!n["tcp"] || !n["vader"]) bad = 1
                          printf "%d connections by tcp between ranks on different hosts, %d by vader between ranks on the same host", n["tcp"], n["vader"]; exit bad }' \
                 "$work/btl_used.log"); then
  echo "FAILED: not tcp between hosts and vader inside each: $summary (Open MPI's bml, btl_base_verbose, in $work/btl_used.log)"
  exit 1
fi
ok "Open MPI's bml: $summary"

# ---- matmul ----------------------------------------------------------------------------------------
run matmul_one on_one "$ranks" "$matmul" --size 256 --mesh "${mesh[@]}"
run matmul_hosts on_hosts "$ranks" "$matmul" --size 256 --mesh "${mesh[@]}"
grep -q "^matches the single-processor product" "$work/matmul_hosts.log" ||
  { echo "FAILED: matmul across the hosts:"; cat "$work/matmul_hosts.log"; exit 1; }
# (Open MPI's own messages, "[HOST:PID] ...", such as plm:rsh's harmless setpgid warning, aside.)
if ! diff <(grep -v -e " ms, " -e '^\[' "$work/matmul_one.log") <(grep -v -e " ms, " -e '^\[' "$work/matmul_hosts.log"); then
  echo "FAILED: matmul across the hosts prints otherwise than on one host (one host <, hosts >)"
  exit 1
fi
ok "matmul across the hosts: $(grep '^matches' "$work/matmul_hosts.log"), as on one host"

# ---- meshtensor-lm: losses, checkpoint, resume -----------------------------------------------------
lm_args=(--layout 2d --mesh "${mesh[@]}" --log-every 1000)
run lm_one5 on_one "$ranks" "$lm" "${lm_args[@]}" --steps 5 --csv "$work/one5.csv"
run lm_one3 on_one "$ranks" "$lm" "${lm_args[@]}" --steps 3 --csv "$work/one3.csv" --checkpoint "$work/ckpt_one" --save-every 3
before=$(veth_bytes)
run lm_hosts3 on_hosts "$ranks" "$lm" "${lm_args[@]}" --steps 3 --csv "$work/hosts3.csv" --checkpoint "$work/ckpt_hosts" --save-every 3
bytes=$(($(veth_bytes) - before))
[ "$(wc -l <"$work/hosts3.csv")" = 4 ] || { echo "FAILED: no 3 losses in $work/hosts3.csv"; exit 1; }
if ! diff <(head -n 4 "$work/one5.csv") "$work/hosts3.csv"; then
  echo "FAILED: the losses across the hosts differ from one host's (one host <, hosts >)"
  exit 1
fi
ok "meshtensor-lm losses of steps 1..3 across the hosts equal one host's bit for bit: $(tail -n 1 "$work/hosts3.csv")"
# The gradients' allreduce over rows crosses the hosts every step: far more than the launch's messages.
[ "$bytes" -gt 100000 ] || { echo "FAILED: only $bytes bytes went through the veths during the run"; exit 1; }
ok "$bytes bytes went through the hosts' veths during that run"
if ! diff -r "$work/ckpt_one" "$work/ckpt_hosts"; then
  echo "FAILED: the checkpoint saved across the hosts differs from the one saved on one host"
  exit 1
fi
ok "its checkpoint ($(cat "$work/ckpt_hosts/latest")) equals the one saved on one host byte for byte"
run lm_resumed on_hosts "$ranks" "$lm" "${lm_args[@]}" --steps 5 --resume "$work/ckpt_hosts" --csv "$work/resumed.csv"
grep -q "resumed from $work/ckpt_hosts at step 3" "$work/lm_resumed.log" ||
  { echo "FAILED: the run did not resume:"; cat "$work/lm_resumed.log"; exit 1; }
if ! diff <(sed -n '5,6p' "$work/one5.csv") <(sed -n '2,$p' "$work/resumed.csv"); then
  echo "FAILED: resumed across the hosts, steps 4..5 differ from one host's uninterrupted run (one host <, hosts >)"
  exit 1
fi
ok "resumed across the hosts from it, steps 4..5 equal one host's uninterrupted run bit for bit"

# ---- checkpoint_tool: the checkpoint directory's protocol across the hosts --------------------------
run tool_one on_one "$ranks" "$tool" loop "$work/tool_one" 2 2
run tool_hosts on_hosts "$ranks" "$tool" loop "$work/tool_hosts" 2 2
diff -r "$work/tool_one" "$work/tool_hosts" ||
  { echo "FAILED: checkpoint_tool's checkpoints saved across the hosts differ from one host's"; exit 1; }
run verify_hosts on_hosts "$ranks" "$tool" verify "$work/tool_hosts"
run verify_one on_one "$ranks" "$tool" verify "$work/tool_hosts"
grep -q "^verified .*: step 2," "$work/verify_hosts.log" && grep -q "^verified .*: step 2," "$work/verify_one.log" ||
  { echo "FAILED: checkpoint_tool verify:"; cat "$work/verify_hosts.log" "$work/verify_one.log"; exit 1; }
ok "checkpoint_tool: 2 checkpoints saved across the hosts equal one host's, and load whole across the hosts and on one host: $(grep '^verified' "$work/verify_hosts.log")"
echo "multihost test ($hosts hosts): all checks passed in ${SECONDS} s"
