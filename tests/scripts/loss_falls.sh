#!/usr/bin/env bash
# loss_falls.sh RATIO REGEX COMMAND...: runs COMMAND (an example under mpiexec) and shows what it
# prints; passes if it succeeds, its output matches REGEX (grep -E; empty: anything), and the last
# loss on its step lines ("step ... loss X": each the mean over the steps since the line before) is
# below RATIO times the first. The examples of fashion_mnist and segmentation print such lines.
set -euo pipefail
ratio=$1 regex=$2
shift 2
set +e
out=$("$@" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" = 0 ] || { echo "FAIL: the run failed (exit $rc)"; exit 1; }
[ -z "$regex" ] || grep -Eq "$regex" <<<"$out" || { echo "FAIL: the output does not match '$regex'"; exit 1; }
awk -v ratio="$ratio" '/^step / { for (i = 1; i < NF; ++i) if ($i == "loss") { n++; if (n == 1) first = $(i + 1); last = $(i + 1) } }
  END { if (n < 2) { print "FAIL: fewer than two printed losses"; exit 1 }
        ok = last < ratio * first
        printf "loss %s -> %s: %s\n", first, last, ok ? "falls below " ratio "x" : "FAIL: does not fall below " ratio "x"
        exit !ok }' <<<"$out"
