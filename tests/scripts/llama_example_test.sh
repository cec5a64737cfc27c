#!/usr/bin/env bash
# The tests of examples/llama: llama_example_test.sh CASE LLAMA WORKDIR MPIEXEC
#   layouts_agree  data, tensor, context (all-to-all and ring) and context_tensor on [2 x 2], and
#                  the sequence unevenly over [1 x 4], give one processor's losses (float32: 1e-4);
#                  with --recompute too, and with the loss in pieces (--loss-chunks); and
#                  context_tensor with its weights sharded (--fsdp, with --recompute)
#   resume         6 steps, against 3 steps, a checkpoint and 3 resumed (under --memory-budget,
#                  whose plan must not touch the checkpoint): the same losses; a checkpoint of
#                  weights stored split (--fsdp) resumed where they are whole, the same losses
#   learns         the loss falls by a quarter in 60 steps on [2 x 2]
#   budget         a sequence of 1024 whose step needs more than 0.05 GiB on one processor: refused
#                  there (exit 2, before training), and trained with the sequence over 4 ranks
#   plan           Llama 3 8B's sizes planned on 8 processors: 8.03 billion parameters (Meta's
#                  figure) and the all-to-all attention's alltoalls in the table; with
#                  --calibration, the predicted products' time is the plan's FLOPs at the file's rate,
#                  and --calibration without --plan is refused, and training without --text; the loss
#                  in 8 pieces plans under half the activations of Llama 3's vocabulary at 8192
#                  positions, and 3 pieces that do not divide them are refused by name; Llama
#                  3.1 8B, 70B and 405B planned from their config.json (tests/data/llama3) within
#                  0.1% of Meta's parameter counts; --fsdp on [8 x 1] plans an eighth of the
#                  weights and Adam's state, and is refused by name under a layout it does not shard
#   bf16           --dtype bf16 (bf16 activations and products, float weights) under the ring's
#                  zigzag layout on [2 x 2] follows one processor's float32 losses (2e-2, but more
#                  than 2e-5 apart: float32 layouts differ by about 1e-6) and
#                  learns; its plan's ring shifts move half float32's bytes
#   moe            a mixture of experts (4 routed SwiGLU experts, top 2, one shared, sigmoid scores,
#                  DeepSeek-V3's bias balancing) under tensor (experts over rows, their d_ff over
#                  cols) on [2 x 2], its buffers in 3 chunks (dispatch and return overlapped), gives
#                  one processor's losses (1e-4; data and tensor whole: the deepseek case), as
#                  does context on [2 x 2] (the sequence over cols, each block's sequences moved
#                  whole to route: the ragged dispatch, each rank's one expert), a resumed
#                  run continues them (the biases in the checkpoint), and learns;
#                  without the biases' updates the losses differ; every block recomputed
#                  (--recompute) gives the same losses; one step against its plan
#                  (bf16, capacity 8, 1 and 2 chunks, 2 chunks recomputed; context); Mixtral 8x7B
#                  planned: 46.70 billion parameters, 12.88 billion active (Mistral: 46.7 and 12.9);
#                  --experts with the ring's zigzag layout, and --top-k without --experts,
#                  refused by name
#   deepseek       DeepSeek-V3's blocks (multi-head latent attention, a dense first block, then 4
#                  routed experts, top 2, beside a shared one, sigmoid scores) under tensor on
#                  [4 x 1] (experts and batch over 4) and [2 x 2] (heads over cols too) give one
#                  processor's losses (1e-4) and learn; one bf16 step against its plan; DeepSeek-V3
#                  planned: 671.03 billion parameters, 37.55 billion active (DeepSeek: 671 and 37);
#                  --pipeline 2 (2 microbatches of 4) gives one processor's losses of 8 on 2
#                  stages of [1 x 1] and (ragged, recomputed, ZB-H1) of [1 x 2], resumed from its
#                  checkpoint (a shard per stage) continues those losses, and its bf16 step
#                  on 2 stages of [2 x 1] equals its plan; --plan --pipeline 2: the stages' blocks
#                  and parameters are the model's, the first stage holds 2 microbatches under 1F1B
#                  and 4 under GPipe, and plans fewer activations under 1F1B; --q-rank without
#                  --kv-rank, --kv-rank under --layout data, --dense-blocks as many as --layers,
#                  --pipeline on too few ranks, with --fsdp, --tie-embeddings or past --layers, --microbatches
#                  without --pipeline refused by name
#   check_plan     one step against its plan under tensor, context (bf16, all-to-all) and
#                  context_tensor (the ring, the loss in 4 pieces; and bf16 with --fsdp and
#                  --recompute) on 4 ranks: collectives and bytes equal, peak within 1%
set -euo pipefail
case_=$1 llama=$2 dir=$3 mpiexec=$4
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
text=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/README.md  # a text the repository ships
run() { local n=$1; shift; "$mpiexec" -n "$n" "$llama" --log-every 1000 --text "$text" "$@" >/dev/null; }
# same A B FROM: every step >= FROM of A is in B, equal to 1e-4 relative
same() {
  awk -F, -v from="$3" 'NR == FNR { if (FNR > 1) a[$1] = $2; next }
    FNR > 1 && $1 >= from { n++; if (!($1 in a)) { print "step " $1 " missing"; bad = 1; next }
                           d = ($2 - a[$1]) / a[$1]; if (d < 0) d = -d; if (d > 1e-4) { print "step " $1 ": " a[$1] " != " $2; bad = 1 } }
    END { if (n == 0) { print "no steps compared"; bad = 1 } exit bad }' "$1" "$2" || { echo "FAIL: $2 differs from $1"; exit 1; }
  echo "$2 equals $1 from step $3"
}
# refused "ARGS|TEXT"...: each ARGS ends a run with an error that holds TEXT
refused() {
  local bad out rc
  for bad in "$@"; do
    set +e
    # shellcheck disable=SC2086
    out=$("$mpiexec" -n 1 "$llama" --text "$text" --steps 1 ${bad%%|*} 2>&1)
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q -- "${bad#*|}" <<<"$out" || { echo "$out"; echo "FAIL: ${bad%%|*} not refused by name"; exit 1; }
  done
}
# parameters NAME TOTAL ACTIVE ARGS...: the model ARGS plans has TOTAL parameters, ACTIVE of them per token
parameters() {
  local name=$1 total=$2 active=$3 out
  shift 3
  out=$("$mpiexec" -n 1 "$llama" --plan "$@")
  grep -E '^(parameters|active)' <<<"$out"
  grep -q "^parameters: $total " <<<"$out" && grep -q "^active parameters per token: $active " <<<"$out" ||
    { echo "$out"; echo "FAIL: $name's parameters"; exit 1; }
}
case $case_ in
  layouts_agree)
    run 1 --steps 4 --csv one.csv
    for layout in data tensor context context_tensor; do
      for attention in all-to-all ring; do
        [ "$layout" = context_tensor ] && [ "$attention" = all-to-all ] && continue
        [ "$attention" = ring ] && [[ $layout != context* ]] && continue
        run 4 --mesh 2 2 --layout "$layout" --attention "$attention" --steps 4 --csv "$layout.$attention.csv"
        same one.csv "$layout.$attention.csv" 1
      done
    done
    run 4 --mesh 2 2 --layout context_tensor --attention ring --recompute --steps 4 --csv recompute.csv
    same one.csv recompute.csv 1
    run 4 --mesh 2 2 --layout context_tensor --attention ring --fsdp --recompute --steps 4 --csv fsdp.csv
    same one.csv fsdp.csv 1
    run 4 --mesh 1 4 --layout context --loss-chunks 2 --steps 4 --csv chunks.csv  # the loss in pieces
    same one.csv chunks.csv 1
    run 1 --steps 4 --length 30 --csv one30.csv
    for attention in all-to-all ring; do  # 8, 8, 7, 7 positions
      run 4 --mesh 1 4 --layout context --attention $attention --length 30 --steps 4 --csv "context30.$attention.csv"
      same one30.csv "context30.$attention.csv" 1
    done ;;
  resume)
    run 2 --mesh 1 2 --layout tensor --steps 6 --csv whole.csv
    run 2 --mesh 1 2 --layout tensor --steps 3 --checkpoint ckpt --save-every 3
    run 2 --mesh 1 2 --layout tensor --steps 6 --resume ckpt --csv resumed.csv --memory-budget 1  # planned without the checkpoint
    same whole.csv resumed.csv 4
    # checkpoints hold whole tensors whatever their layout: weights and Adam's state stored split
    # over rows (--fsdp) resume where the layout keeps them whole
    run 2 --mesh 2 1 --layout context_tensor --attention ring --fsdp --steps 3 --checkpoint sharded --save-every 3
    run 2 --mesh 1 2 --layout tensor --steps 6 --resume sharded --csv resumed_sharded.csv
    same whole.csv resumed_sharded.csv 4 ;;
  learns)
    run 4 --mesh 2 2 --layout tensor --steps 60 --csv loss.csv
    awk -F, 'NR == 2 { first = $2 } END { print "loss " first " -> " $2; exit !($2 < 0.75 * first) }' loss.csv ;;
  budget)
    small=(--layout context --kv-heads 4 --group 1 --batch 1 --length 1024 --memory-budget 0.05 --steps 1 --text "$text")
    set +e
    out=$("$mpiexec" -n 1 "$llama" --mesh 1 1 "${small[@]}" 2>&1)
    rc=$?
    set -e
    echo "$out"
    [ "$rc" = 2 ] && grep -q 'budget 0.05 GiB per processor: DOES NOT FIT' <<<"$out" || { echo "FAIL: one processor not refused (rc $rc)"; exit 1; }
    out=$("$mpiexec" -n 4 "$llama" --mesh 1 4 "${small[@]}" --csv four.csv) || { echo "$out"; echo "FAIL: four ranks failed"; exit 1; }
    echo "$out"
    grep -q 'budget 0.05 GiB per processor: fits' <<<"$out" && [ "$(( $(wc -l < four.csv) ))" = 2 ] || { echo "FAIL: four ranks did not train"; exit 1; } ;;
  plan)
    out=$("$mpiexec" -n 1 "$llama" --plan --mesh 1 8 --layout context --d-model 4096 --layers 32 --kv-heads 8 --group 4 \
            --d-kv 128 --d-ff 14336 --vocab 128256 --batch 1 --length 8192)
    echo "$out"
    grep -q '(8.03 billion)' <<<"$out" || { echo "FAIL: not Llama 3 8B's 8.03 billion parameters"; exit 1; }
    grep -q 'alltoall' <<<"$out" || { echo "FAIL: no alltoall in the plan"; exit 1; }
    # A machine of 1e12 FLOP/s, no other cost: the products' time is the FLOPs over 1e9 in ms.
    printf 'ranks 8\ngemm_flops_per_s 1e12\nbytes_per_s 1e30\noptimizer_bytes_per_s 1e30\nhost_bytes_per_s 1e30\nseconds_per_kernel 0\n' > machine.cal
    for c in allreduce reduce_scatter allgather alltoall shift exscan; do echo "collective $c 8 0 0" >> machine.cal; done
    out=$("$mpiexec" -n 1 "$llama" --plan --mesh 1 8 --layout context --d-model 256 --layers 2 --kv-heads 8 --group 2 \
            --d-kv 32 --d-ff 512 --vocab 1000 --batch 1 --length 512 --calibration machine.cal)
    grep 'predicted\|local FLOPs' <<<"$out"
    awk '/^local FLOPs/ { gsub(/;/, "", $4); flops = $4 }
         /^predicted step time/ { for (i = 1; i <= NF; ++i) if ($i == "products") { p = $(i + 1); gsub(/,/, "", p) } }
         END { want = flops / 1e9; d = p - want; if (d < 0) d = -d
               print "products " p " ms, FLOPs / 1e9 = " want; exit !(flops > 0 && d <= 1e-3 * want + 1e-3) }' <<<"$out" ||
      { echo "FAIL: the predicted products' time is not the plan's FLOPs at 1e12 FLOP/s"; exit 1; }
    set +e
    out=$("$mpiexec" -n 1 "$llama" --steps 1 --calibration machine.cal 2>&1)
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q -- '--calibration needs --plan' <<<"$out" ||
      { echo "$out"; echo "FAIL: --calibration without --plan not refused (rc $rc)"; exit 1; }
    # The loss in 8 pieces: Llama 3's vocabulary at 8192 positions on 8 processors (the ring) plans
    # under half the activations; 3 pieces of 8192 positions are refused by name.
    small=(--plan --mesh 8 1 --layout context_tensor --attention ring --d-model 256 --layers 2 --kv-heads 8 --group 2
           --d-kv 32 --d-ff 512 --vocab 128256 --batch 1 --length 8192)
    whole=$("$mpiexec" -n 1 "$llama" "${small[@]}" | awk '/^  peak/ { print $NF }')
    pieces=$("$mpiexec" -n 1 "$llama" "${small[@]}" --loss-chunks 8 | awk '/^  peak/ { print $NF }')
    echo "planned activations at the peak: $whole GiB whole, $pieces GiB in 8 pieces"
    awk -v w="$whole" -v p="$pieces" 'BEGIN { exit !(w > 0 && p > 0 && p < w / 2) }' ||
      { echo "FAIL: the loss in 8 pieces does not plan under half the activations"; exit 1; }
    set +e
    out=$("$mpiexec" -n 1 "$llama" "${small[@]}" --loss-chunks 3 2>&1)
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q "dim 'length' of extent 8192 .* multiple of 48" <<<"$out" ||
      { echo "$out"; echo "FAIL: --loss-chunks 3 of 8192 positions not refused by name (rc $rc)"; exit 1; }
    # Llama 3.1 8B, 70B and 405B planned from their published config.json alone: Meta's counts to 0.1%.
    configs=$(cd "$(dirname "${BASH_SOURCE[0]}")/../data/llama3" && pwd)
    for size in 8B:8.03 70B:70.6 405B:405.9; do
      out=$("$mpiexec" -n 1 "$llama" --plan --config "$configs/Llama-3.1-${size%%:*}.config.json" --mesh 1 8 \
                 --layout tensor --batch 1 --length 256 2>&1) || { echo "$out"; echo "FAIL: ${size%%:*} not planned"; exit 1; }
      awk -v want="${size#*:}" '/^parameters: / { n = $2 / 1e9; d = (n - want) / want; if (d < 0) d = -d
             print "planned " n " billion parameters, Meta " want; found = 1; exit !(d <= 1e-3) }
           END { if (!found) exit 1 }' <<<"$out" || { echo "$out"; echo "FAIL: Llama 3.1 ${size%%:*}'s parameters"; exit 1; }
    done
    # --fsdp: Llama 3 8B's weights and Adam's state on [8 x 1] stored split over the 8 rows
    eight=(--plan --mesh 8 1 --layout context_tensor --attention ring --d-model 4096 --layers 32 --kv-heads 8 --group 4
           --d-kv 128 --d-ff 14336 --vocab 128256 --batch 1 --length 256)
    whole=$("$mpiexec" -n 1 "$llama" "${eight[@]}" | awk '/^  peak/ { print $6, $10 }')
    sharded=$("$mpiexec" -n 1 "$llama" "${eight[@]}" --fsdp | awk '/^  peak/ { print $6, $10 }')
    echo "planned GiB of weights and of Adam's state: $whole whole, $sharded with --fsdp"
    awk -v w="$whole" -v s="$sharded" 'BEGIN { split(w, a, " "); split(s, b, " ")
         for (i = 1; i <= 2; ++i) { r = a[i] / (8 * b[i]); if (!(b[i] > 0 && r > 0.999 && r < 1.001)) exit 1 } }' ||
      { echo "FAIL: --fsdp on 8 rows does not plan an eighth of the weights and of Adam's state"; exit 1; }
    set +e
    out=$("$mpiexec" -n 1 "$llama" --plan --layout tensor --fsdp 2>&1)
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q -- '--layout tensor is not sharded: use --layout context_tensor' <<<"$out" ||
      { echo "$out"; echo "FAIL: --fsdp under --layout tensor not refused by name (rc $rc)"; exit 1; }
    set +e
    out=$("$mpiexec" -n 1 "$llama" --steps 1 2>&1)  # training without --text: no default file
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q -- '--text FILE: the text to train on' <<<"$out" ||
      { echo "$out"; echo "FAIL: training without --text not refused by name (rc $rc)"; exit 1; } ;;
  bf16)
    run 1 --steps 30 --csv float.csv
    run 4 --mesh 2 2 --layout context_tensor --attention ring --dtype bf16 --steps 30 --csv bf16.csv
    awk -F, 'NR == FNR { if (FNR > 1) a[$1] = $2; next }
      FNR > 1 { n++; d = ($2 - a[$1]) / a[$1]; if (d < 0) d = -d; if (d > worst) worst = d; if (FNR == 2) first = $2; last = $2 }
      END { print n " steps, largest relative difference " worst ", loss " first " -> " last
            exit !(n == 30 && worst <= 2e-2 && worst > 2e-5 && last < 0.8 * first) }' float.csv bf16.csv ||
      { echo "FAIL: bf16 does not follow float32 within 2e-2, differs as little as float32 across layouts (not bf16: 1e-6), or does not learn"; exit 1; }
    shift_bytes() {  # the ring's forward shift bytes in a plan of the given dtype
      "$mpiexec" -n 1 "$llama" --plan --mesh 4 1 --layout context_tensor --attention ring --length 256 --dtype "$1" |
        awk '$1 == "ring_grouped_causal_attention" && $2 == "shift" { print $5 }'
    }
    f=$(shift_bytes float32) b=$(shift_bytes bf16)
    echo "ring shift bytes: float32 $f, bf16 $b"
    [ -n "$f" ] && [ "$((2 * b))" = "$f" ] || { echo "FAIL: bf16's shifts do not move half float32's bytes"; exit 1; } ;;
  moe)
    unbiased=(--experts 4 --top-k 2 --shared-experts 1 --router sigmoid --routed-scale 2.5 --d-ff 48)
    moe=("${unbiased[@]}" --router-bias-rate 0.01)
    run 1 --steps 4 "${moe[@]}" --csv one.csv
    # the bias steers the routing: without its updates the losses differ
    run 1 --steps 4 "${unbiased[@]}" --csv unbiased.csv
    if (same one.csv unbiased.csv 2) >/dev/null; then echo "FAIL: --router-bias-rate changed nothing"; exit 1; fi
    # the experts' buffers in 3 chunks, dispatch and return overlapping the products: the same losses
    run 4 --mesh 2 2 --layout tensor --steps 4 "${moe[@]}" --expert-chunks 3 --csv chunks.csv
    same one.csv chunks.csv 1
    # the sequence split over cols (context parallelism): each block's normalised input moved by an
    # alltoall to whole sequences over rows and cols, routed (the ragged dispatch, dropless as
    # above) and moved back: the same losses
    run 4 --mesh 2 2 --layout context --steps 4 "${moe[@]}" --moe-dispatch ragged --csv context.csv
    same one.csv context.csv 1
    # every block recomputed in the backward pass: routed again alike, its loads and balance loss
    # kept from the first run, the same losses (the router's bias moved by the loads each step)
    run 2 --mesh 2 1 --steps 4 "${moe[@]}" --recompute --csv recomputed.csv
    same one.csv recomputed.csv 1
    # the router's biases are in the checkpoint: a resumed run routes as the whole one did
    run 2 --mesh 2 1 --steps 6 "${moe[@]}" --csv whole.csv
    run 2 --mesh 2 1 --steps 3 "${moe[@]}" --checkpoint ckpt --save-every 3
    run 2 --mesh 2 1 --steps 6 "${moe[@]}" --resume ckpt --csv resumed.csv
    same whole.csv resumed.csv 4
    run 4 --mesh 2 2 --layout tensor --steps 40 "${moe[@]}" --csv learns.csv
    awk -F, 'NR == 2 { first = $2 } END { print "loss " first " -> " $2; exit !($2 < 0.8 * first) }' learns.csv
    for extra in "--layout data --expert-chunks 1" "--layout data --expert-chunks 2" \
                 "--layout data --expert-chunks 2 --recompute" "--layout context"; do
      # shellcheck disable=SC2086
      out=$("$mpiexec" -n 4 "$llama" --text "$text" --check-plan --memory-tolerance 0.01 --mesh 2 2 \
              --dtype bf16 --capacity 8 $extra "${moe[@]}" 2>&1) ||
        { echo "$out"; echo "FAIL: --check-plan with --experts, $extra"; exit 1; }
      grep 'check-plan' <<<"$out"
      grep -q 'the plan equals the real step on every rank' <<<"$out" && grep -q ': close$' <<<"$out" ||
        { echo "$out"; echo "FAIL: --check-plan with --experts, $extra: the plan not equal or the peak not close"; exit 1; }
    done
    # Mixtral 8x7B (its config.json): Llama 2's blocks at 4096 wide, 8 experts of 14336, top 2.
    # 32 x (attention 41943040 + router 32768 + 8 x 176160768 + norms 8192) + 2 x 32000 x 4096 + 4096
    # = 46702792704; active: less 32 x 6 x 176160768 = 12879925248.
    parameters "Mixtral 8x7B" 46702792704 12879925248 --mesh 8 1 --layout tensor --d-model 4096 --layers 32 --kv-heads 8 \
      --group 4 --d-kv 128 --d-ff 14336 --vocab 32000 --experts 8 --top-k 2 --batch 8 --length 4096 --dtype bf16
    refused "--layout context_tensor --attention ring --experts 4|--experts: a sequence is routed as a group, which --layout context_tensor splits" \
            "--top-k 2|--top-k needs --experts N" ;;
  deepseek)
    blocks=(--layers 3 --dense-blocks 1 --dense-d-ff 96 --kv-rank 24 --q-rank 32 --d-rope 8 --group 1 --kv-heads 4
            --experts 4 --top-k 2 --shared-experts 1 --router sigmoid --routed-scale 2.5 --d-ff 32 --router-bias-rate 0.01)
    run 1 --layout tensor --steps 4 "${blocks[@]}" --csv one.csv
    # [4 x 1]: the batch and the experts over 4 (DeepSeek's parallelism); [2 x 2]: the heads over cols too
    for mesh in "4 1" "2 2"; do
      run 4 --mesh $mesh --layout tensor --steps 4 "${blocks[@]}" --csv "mesh${mesh// /x}.csv"
      same one.csv "mesh${mesh// /x}.csv" 1
    done
    # the ragged dispatch (dropless without buffers): the one-hot dispatch's losses, dropless too; on
    # [2 x 2] each expert's d_ff over cols too (expert tensor parallelism), and each rank's 2 experts
    # in 2 chunks (one chunk's rows in flight while the other's experts compute)
    for mesh in "2 1" "2 2"; do
      chunks=1
      [ "$mesh" = "2 2" ] && chunks=2
      run $((${mesh% *} * ${mesh#* })) --mesh $mesh --layout tensor --steps 4 "${blocks[@]}" --moe-dispatch ragged \
        --expert-chunks $chunks --csv "ragged${mesh// /x}.csv"
      same one.csv "ragged${mesh// /x}.csv" 1
    done
    # its plan: the same collectives; the rows each rank sends back and holds are the router's (an even
    # share planned): the bytes they move equal summed over the ranks, the peaks within 5% (2.2% seen)
    out=$("$mpiexec" -n 4 "$llama" --text "$text" --check-plan --memory-tolerance 0.05 --layout tensor --mesh 4 1 \
            --dtype bf16 "${blocks[@]}" --moe-dispatch ragged 2>&1) || { echo "$out"; echo "FAIL: --check-plan, ragged"; exit 1; }
    grep 'check-plan' <<<"$out"
    grep -q 'the plan equals the real step on every rank' <<<"$out" && grep -q ': close$' <<<"$out" ||
      { echo "$out"; echo "FAIL: --check-plan with the ragged dispatch: the plan not equal or the peak not close"; exit 1; }
    run 2 --mesh 2 1 --layout tensor --steps 30 "${blocks[@]}" --csv learns.csv
    awk -F, 'NR == 2 { first = $2 } END { print "loss " first " -> " $2; exit !($2 < 0.8 * first) }' learns.csv
    out=$("$mpiexec" -n 4 "$llama" --text "$text" --check-plan --memory-tolerance 0.01 --layout tensor --mesh 2 2 \
            --dtype bf16 "${blocks[@]}" 2>&1) || { echo "$out"; echo "FAIL: --check-plan with latent attention"; exit 1; }
    grep 'check-plan' <<<"$out"
    grep -q 'the plan equals the real step on every rank' <<<"$out" && grep -q ': close$' <<<"$out" ||
      { echo "$out"; echo "FAIL: --check-plan with latent attention: the plan not equal or the peak not close"; exit 1; }
    # DeepSeek-V3 (its config.json's sizes): 61 blocks of d_model 7168, 128 heads; latent attention
    # per block 7168 x 1536 + 1536 + 128 x 128 x 1536 + 128 x 64 x 1536 + 512 x 7168 + 64 x 7168 + 512
    # + 2 x 128 x 128 x 512 + 7168 x 128 x 128, norms 2 x 7168: 187121664; 3 dense blocks of
    # 3 x 7168 x 18432; 58 of a router 256 x 7168, 256 routed and 1 shared expert of 3 x 7168 x 2048;
    # embedding and output 2 x 129280 x 7168, final norm 7168: 671026404352; active: less
    # 58 x 248 x 44040192 = 37552282624.
    parameters DeepSeek-V3 671026404352 37552282624 --mesh 64 1 --layout tensor --d-model 7168 --layers 61 --dense-blocks 3 \
      --dense-d-ff 18432 --kv-heads 128 --group 1 --d-kv 128 --kv-rank 512 --q-rank 1536 --d-rope 64 --d-ff 2048 \
      --experts 256 --top-k 8 --shared-experts 1 --router sigmoid --vocab 129280 --batch 64 --length 64 --dtype bf16
    # --pipeline 2: the blocks over 2 stages, 2 microbatches of 4 sequences, give one processor's
    # losses of 8 (the stages' weights drawn as the whole model's): on 2 stages of [1 x 1]; on 2 of
    # [1 x 2] (each expert's d_ff over cols) by the ragged dispatch, recomputed, under ZB-H1
    run 2 --layout tensor --steps 4 "${blocks[@]}" --pipeline 2 --microbatches 2 --batch 4 --csv pipe2.csv
    same one.csv pipe2.csv 1
    # a pipeline's checkpoint (a shard per stage, the whole model's names): saved at step 2 and
    # resumed, the run continues the whole one's losses
    run 2 --layout tensor --steps 2 "${blocks[@]}" --pipeline 2 --microbatches 2 --batch 4 --checkpoint pipe_ckpt \
      --save-every 2
    run 2 --layout tensor --steps 4 "${blocks[@]}" --pipeline 2 --microbatches 2 --batch 4 --resume pipe_ckpt \
      --csv pipe_resumed.csv
    same pipe2.csv pipe_resumed.csv 3
    out=$("$mpiexec" -n 3 "$llama" --text "$text" --layout tensor --steps 4 "${blocks[@]}" --pipeline 3 --microbatches 2 \
            --batch 4 --resume pipe_ckpt 2>&1) && { echo "$out"; echo "FAIL: a 2-stage checkpoint resumed on 3 stages"; exit 1; }
    grep -q -- "--resume pipe_ckpt: the checkpoint has pipeline = 2, this run 3" <<<"$out" ||
      { echo "$out"; echo "FAIL: a 2-stage checkpoint on 3 stages not refused by name"; exit 1; }
    run 4 --mesh 1 2 --layout tensor --steps 4 "${blocks[@]}" --pipeline 2 --microbatches 2 --batch 4 \
      --moe-dispatch ragged --recompute --schedule zb-h1 --csv pipe4.csv
    same one.csv pipe4.csv 1
    # and its plan: one bf16 step on 2 stages of [2 x 1] (the experts over rows), each rank's stage
    # planned at its coordinates: the same collectives and sends, the peak within 1% (equal seen)
    out=$("$mpiexec" -n 4 "$llama" --text "$text" --check-plan --memory-tolerance 0.01 --layout tensor --mesh 2 1 \
            --dtype bf16 "${blocks[@]}" --pipeline 2 --microbatches 2 --batch 4 2>&1) || { echo "$out"; echo "FAIL: --check-plan, pipeline"; exit 1; }
    grep 'check-plan' <<<"$out"
    grep -q 'the plan equals the real step on every rank' <<<"$out" && grep -q ': close$' <<<"$out" ||
      { echo "$out"; echo "FAIL: --check-plan of a pipeline: the plan not equal or the peak not close"; exit 1; }
    # --plan --pipeline: the blocks over 2 stages; the stages' parameters are the model's (besides the
    # second stage's stand-in embedding, a row per processor of d_model 64, and the first stage's
    # final norm, 64, which every stage holds and the last uses); under 1F1B the first
    # stage holds 2 microbatches in flight and plans fewer activations than under GPipe, which holds 4
    whole=$("$mpiexec" -n 1 "$llama" --plan --mesh 2 1 --layout tensor "${blocks[@]}" --dtype bf16 | awk '/^parameters:/ { print $2 }')
    stages() { "$mpiexec" -n 1 "$llama" --plan --mesh 2 1 --layout tensor "${blocks[@]}" --dtype bf16 --pipeline 2 --microbatches 4 "$@"; }
    one=$(stages) gpipe=$(stages --schedule gpipe)
    echo "$one"
    grep -q '^  stage  0 (blocks 0-0, 1 dense, the embedding; .*), 2 in flight' <<<"$one" &&
      grep -q '^  stage  1 (blocks 1-2, 0 dense, the output layer; .*), 1 in flight' <<<"$one" &&
      grep -q '^  stage  0 .*, 4 in flight' <<<"$gpipe" || { echo "$gpipe"; echo "FAIL: the stages' blocks or microbatches in flight"; exit 1; }
    awk -v whole="$whole" '/^  stage/ { n += substr($0, index($0, "; ") + 2) + 0 }
         END { print "stages: " n " parameters, the model " whole ", 2 x 64 stand-in and 64 of a final norm"; exit !(n == whole + 2 * 64 + 64) }' <<<"$one" ||
      { echo "FAIL: the stages' parameters are not the model's"; exit 1; }
    activations() { awk '/^  stage  0/ { print $NF }'; }
    a1=$(activations <<<"$one") ag=$(activations <<<"$gpipe")
    echo "the first stage's planned activations: 1f1b $a1 GiB, gpipe $ag GiB"
    awk -v a="$a1" -v g="$ag" 'BEGIN { exit !(a > 0 && a < g) }' || { echo "FAIL: 1F1B's first stage plans no fewer activations than GPipe's"; exit 1; }
    refused "--q-rank 8|--q-rank needs --kv-rank N" \
            "--experts 4 --moe-dispatch ragged --capacity 4|the ragged dispatch is dropless: it needs capacity = 0" \
            "--experts 4 --moe-dispatch ragged --expert-chunks 5|overlap_chunks = 5 cuts each processor's experts into chunks, but a processor holds 4 of the 4 experts" \
            "--layout data --kv-rank 8 --q-rank 8 --d-rope 4|--kv-rank: latent attention is built for --layout tensor" \
            "--experts 2 --layers 2 --dense-blocks 2|--dense-blocks 2 leaves none of the --layers 2 blocks" \
            "--pipeline 2|2 stages of 1 processors need 2 ranks; the communicator has 1" \
            "--pipeline 2 --fsdp|--pipeline 2 trains (from scratch or its own checkpoints) and plans; --fsdp is for an unpipelined run" \
            "--pipeline 2 --tie-embeddings|--tie-embeddings with --pipeline 2: the first stage's embedding and the last stage's output layer would be two copies trained apart" \
            "--plan --pipeline 3 --layers 2|--pipeline 3 stages need at least as many blocks; --layers is 2" \
            "--plan --microbatches 4|--microbatches needs --pipeline P" ;;
  check_plan)
    # Each layout's step against its plan on 4 ranks: collectives, parameter and Adam bytes equal on
    # every rank, the planned peak within 1% of the caching allocator's (0.9995-0.9997 measured).
    for args in "--layout tensor --mesh 2 2" "--layout context --attention all-to-all --mesh 1 4 --dtype bf16" \
                "--layout context_tensor --attention ring --mesh 2 2 --loss-chunks 4" \
                "--layout context_tensor --attention ring --mesh 2 2 --fsdp --dtype bf16 --recompute"; do
      out=$("$mpiexec" -n 4 "$llama" --text "$text" --check-plan --memory-tolerance 0.01 $args 2>&1) ||
        { echo "$out"; echo "FAIL: --check-plan $args"; exit 1; }
      grep 'check-plan' <<<"$out"
      grep -q 'the plan equals the real step on every rank' <<<"$out" && grep -q ': close$' <<<"$out" ||
        { echo "$out"; echo "FAIL: --check-plan $args did not report the plan equal and the peak close"; exit 1; }
    done
    set +e
    out=$("$mpiexec" -n 1 "$llama" --text "$text" --check-plan --plan 2>&1)
    rc=$?
    set -e
    [ "$rc" != 0 ] && grep -q -- '--check-plan runs one training step' <<<"$out" ||
      { echo "$out"; echo "FAIL: --check-plan with --plan not refused by name (rc $rc)"; exit 1; } ;;
  *) echo "unknown case $case_"; exit 2 ;;
esac
