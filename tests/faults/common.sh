# shellcheck shell=bash disable=SC2154,SC2034
# Helpers of the fault tests (kill_restart_test.sh, watchdog_stop_test.sh, stop_signal_test.sh,
# straggler_test.sh); sourced, not run.
# clean_run and same_result expect: lm mpiexec work (paths), and common (meshtensor-lm's arguments).
# FAULTS_JOB: how the job's 4 ranks train (default: --layout 2d --mesh 2 2); the pipelined tests
# give e.g. "--pipeline 2 --mesh 2 1 --microbatches 2 --schedule 1f1b" (2 stages of [2 x 1]).
read -r -a job <<<"${FAULTS_JOB:---layout 2d --mesh 2 2}"

# A string as an extended regular expression matching itself.
re_escape() { sed 's/[][\.*^$+?(){}|/]/\\&/g' <<<"$1"; }

# The PIDs of the job's ranks: processes whose command line names CSV and whose environment has
# OMPI_COMM_WORLD_RANK (mpiexec and the supervisor name CSV too, but are no ranks).
rank_pids() {
  local pid
  for pid in $(pgrep -f -- "--csv $(re_escape "$1")( |$)"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK='; then echo "$pid"; fi
  done
}
rank_of() { tr '\0' '\n' <"/proc/$1/environ" | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }

# wait_rank_pids N CSV: sets pids to the PIDs of the ranks of the job writing CSV (rank_pids),
# waiting up to 5 s for N of them; fails where there are not N by then (pids as last found).
wait_rank_pids() {
  local n=$1 csv=$2 _
  pids=()
  for _ in $(seq 100); do
    mapfile -t pids < <(rank_pids "$csv")
    [ "${#pids[@]}" -eq "$n" ] && return 0
    sleep 0.05
  done
  return 1
}

# wait_line FILE FROM REGEX SECONDS PID: the first line after line FROM of FILE matching REGEX, as
# "NUMBER:LINE"; fails after SECONDS, or when PID (the supervisor) has ended without it.
wait_line() {
  local file=$1 from=$2 regex=$3 seconds=$4 pid=$5 hit end
  end=$(( $(date +%s) + seconds ))
  while :; do
    hit=$(tail -n "+$((from + 1))" "$file" 2>/dev/null | grep -n -m 1 -E -- "$regex" || true)
    if [ -n "$hit" ]; then echo "$(( ${hit%%:*} + from )):${hit#*:}"; return 0; fi
    if [ "$(date +%s)" -ge "$end" ]; then echo "no line matching '$regex' within ${seconds}s" >&2; return 1; fi
    if ! kill -0 "$pid" 2>/dev/null; then
      hit=$(tail -n "+$((from + 1))" "$file" | grep -n -m 1 -E -- "$regex" || true)
      if [ -n "$hit" ]; then echo "$(( ${hit%%:*} + from )):${hit#*:}"; return 0; fi
      echo "the supervisor ended before a line matching '$regex'" >&2; return 1
    fi
    sleep 0.02
  done
}

# The clean run: the same job, never interrupted, unsupervised.
clean_run() {
  if ! "$mpiexec" -n 4 "$lm" "${common[@]}" --checkpoint "$work/clean/ckpt" --csv "$work/clean/loss.csv" \
       >"$work/clean/out" 2>&1; then
    echo "the clean run failed:"; cat "$work/clean/out"; exit 1
  fi
}

# same_result: the supervised run's final checkpoint equals the clean run's byte for byte
# (parameters, optimizer state, step, data position; the header holds nothing run-specific), and
# the losses of the steps its last attempt trained equal the clean run's.
same_result() {
  local clean sup
  clean=$work/clean/ckpt/$(cat "$work/clean/ckpt/latest")
  sup=$work/ckpt/$(cat "$work/ckpt/latest")
  if [ "$(basename "$clean")" != "$(basename "$sup")" ]; then
    echo "the supervised run's last checkpoint is $(basename "$sup"), the clean run's $(basename "$clean")"; return 1
  fi
  # model.safetensors, or a pipeline's shards and their index.
  local file
  for file in "$clean"/*.safetensors "$clean"/*.json; do
    [ -e "$file" ] || continue
    if ! cmp "$file" "$sup/$(basename "$file")"; then
      echo "the final checkpoint differs from the clean run's: $sup/$(basename "$file"), $file"; return 1
    fi
  done
  awk -F, 'NR == FNR { loss[$1] = $2; next }
           FNR > 1 { n++; if (!($1 in loss) || loss[$1] != $2) { bad++; if (bad <= 5) print "step " $1 ": loss " $2 ", clean run " loss[$1] } ; if (first == "") first = $1; last = $1 }
           END { if (n == 0) { print "the last attempt wrote no losses"; exit 1 }
                 if (bad) { print bad " of the losses of steps " first ".." last " differ from the clean run'"'"'s"; exit 1 }
                 print "final checkpoint " ckpt " equals the clean run'"'"'s byte for byte; losses of steps " first ".." last " equal" }' \
      ckpt="$(basename "$sup")" "$work/clean/loss.csv" "$work/supervised.csv"
}

# seed_random WHAT: sets seed (MESHTENSOR_FAULTS_SEED, else one from the clock) and random_state
# (draw's) to it, and says "seed S (MESHTENSOR_FAULTS_SEED=S repeats WHAT)".
seed_random() {
  seed=${MESHTENSOR_FAULTS_SEED:-$(( $(date +%s%N) % 1000000 ))}
  random_state=$seed
  echo "seed $seed (MESHTENSOR_FAULTS_SEED=$seed repeats $1)"
}

# draw N: sets drawn to a pseudo-random number in 0..N-1 from random_state (seed_random first);
# the high bits of an LCG (bash's RANDOM, seeded, gave the same rank three times in a row).
draw() {
  random_state=$(( (random_state * 1103515245 + 12345) & 0x7fffffff ))
  drawn=$(( (random_state >> 16) % $1 ))
}
