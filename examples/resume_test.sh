#!/usr/bin/env bash
# resume_test.sh EXAMPLE MPIEXEC WORKDIR [ARGS...]: for meshtensor-lm (tools/lm), fashion_mnist or
# jacobi (any program with --layout, --mesh, --steps, --csv, --checkpoint, --save-every, --resume),
# a run of 40 steps equals, bit for bit, a run of 20 steps that saves a checkpoint and a run resumed
# from it for 20 more (same layout, 4 ranks); resumed on 2 ranks under another layout, the losses
# (jacobi: residuals) agree to 1e-5 relative. ARGS go to every run (meshtensor-lm's test turns
# dropout on, so the resumed run must also continue the dropout masks, besides the data position).
# The layouts and rank counts come from the environment: RESUME_RANKS and RESUME_LAYOUT (default 4,
# --layout 2d), OTHER_RANKS and OTHER_LAYOUT (default 2, --layout data --mesh 2 1; several: rank
# counts apart by spaces, layouts by " | ", each resumed and compared), OTHER_TOLERANCE. SAVE_EVERY
# (default 20) and SAVE_ARGS (e.g. --async-save) go to the saving run of 20 steps; the runs resume
# from its last save.
set -euo pipefail
lm=$1 mpiexec=$2 work=$3
shift 3
rm -rf "$work"
mkdir -p "$work"
common=(--log-every 1000 "$@")
run() { local n=$1; shift; "$mpiexec" -n "$n" "$lm" "$@" >"$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }
ranks=${RESUME_RANKS:-4}
read -r -a other_ranks <<<"${OTHER_RANKS:-2}"
read -r -a layout <<<"${RESUME_LAYOUT:---layout 2d}"
others=()
while IFS= read -r one; do others+=("$one"); done < <(sed 's/ | /\n/g' <<<"${OTHER_LAYOUT:---layout data --mesh 2 1}")
[ "${#others[@]}" -eq "${#other_ranks[@]}" ] || { echo "OTHER_RANKS has ${#other_ranks[@]} counts for ${#others[@]} layouts"; exit 1; }

run "$ranks" "${layout[@]}" "${common[@]}" --steps 40 --csv "$work/full.csv"
every=${SAVE_EVERY:-20}
read -r -a save_args <<<"${SAVE_ARGS:-}"
at=$((20 / every * every))
run "$ranks" "${layout[@]}" "${common[@]}" --steps 20 --checkpoint "$work/ckpt" --save-every "$every" "${save_args[@]}" \
  --csv "$work/first.csv"
run "$ranks" "${layout[@]}" "${common[@]}" --steps 40 --resume "$work/ckpt" --csv "$work/resumed.csv"
grep -q "resumed from $work/ckpt at step $at" "$work/last.log" || { echo "the run did not resume at step $at:"; cat "$work/last.log"; exit 1; }

# Same layout: the 40-step curve is the 20-step curve followed by the resumed one, exactly.
if ! diff <(sed -n '2,21p' "$work/full.csv") <(sed -n '2,$p' "$work/first.csv") >/dev/null ||
   ! diff <(sed -n "$((at + 2)),41p" "$work/full.csv") <(sed -n '2,$p' "$work/resumed.csv"); then
  echo "resumed losses differ from the uninterrupted run's (steps, losses above)"
  exit 1
fi
[ "$(wc -l <"$work/resumed.csv")" -eq $((41 - at)) ] || { echo "the resumed run did not train steps $((at + 1))..40"; exit 1; }
# Another layout and rank count: equal to OTHER_TOLERANCE relative (default 1e-5; the layouts round
# apart more the more steps follow the resume).
for i in "${!others[@]}"; do
  read -r -a other <<<"${others[$i]}"
  run "${other_ranks[$i]}" "${other[@]}" "${common[@]}" --steps 40 --resume "$work/ckpt" --csv "$work/other_layout.csv"
  paste -d, <(sed -n "$((at + 2)),41p" "$work/full.csv") <(sed -n '2,$p' "$work/other_layout.csv") |
    awk -F, -v tol="${OTHER_TOLERANCE:-1e-5}" -v what="${others[$i]} on ${other_ranks[$i]} ranks" -v at="$at" \
      '{ d = $2 - $4; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > worst) worst = r; if ($1 != $3) bad = 1; n++ }
       END { printf "resumed under %s: largest relative difference %.2e over the resumed steps (tolerance %s)\n", what, worst, tol;
             exit (bad || n != 40 - at || worst > tol + 0) }'
done
echo "resumed on the same layout: steps $((at + 1))..40 equal the uninterrupted run bit for bit"
