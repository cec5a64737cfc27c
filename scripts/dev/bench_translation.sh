#!/usr/bin/env bash
# Translation quality and step time, side by side in one run: examples/translation (one rank, the
# data layout, then --layouts' others on 4 ranks) against PyTorch's nn.Transformer of the same size
# (benchmarks/peers/torch_translation.py), trained on the same tokens, batches and steps; both
# decode the test split greedily and with beam search (beam 4, alpha 0.6) and sacrebleu scores them
# against the French references, beside the copy-the-source baseline. Prints a Markdown table and
# both sides' decode times for the test split (greedy, beam), and writes the curves (CSV, and a PNG
# when gnuplot is installed) to the output directory.
#
#   OPENBLAS_CORETYPE=SkylakeX scripts/dev/bench_translation.sh [--steps 2000] [--batch 32] [--out DIR]
#                                                        [--layouts "model_parallel dp_mp"]
#
# Model: d_model 128, heads 4 (d_kv 32), d_ff 512, 2 + 2 layers, SentencePiece vocab 4000, lengths
# 32 / 32, dropout 0.1, Adam lr 1e-3 (constant). One thread per process (OMP_NUM_THREADS=1,
# torch.set_num_threads(1)). OPENBLAS_CORETYPE is read, never set. The example is built at -O3 in
# MESHTENSOR_BUILD_DIR (default build/translation); PyTorch is Debian's python3-torch, sacrebleu the
# install script's Python environment's.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
steps=2000 batch=32 out="$root/build/bench_translation" layouts=""
bench_args "$0" 2,17 --steps:steps --batch:batch --out:out --layouts:layouts -- "$@"
log() { echo "[bench_translation] $*" >&2; }

deps=$(bash "$root/scripts/install_deps.sh")
bench_kokkos=$(echo "$deps" | sed -n 's/^KOKKOS_ROOT=//p' | tail -n 1)
python=$(echo "$deps" | sed -n 's/^CHECKPOINT_PYTHON=//p' | tail -n 1)
if [ -z "$python" ] || ! "$python" -c 'import sacrebleu, torch' 2>/dev/null; then
  echo "bench_translation.sh: needs the install script's Python environment with sacrebleu and PyTorch" \
       "(scripts/install_deps.sh makes it; Debian's python3-torch)" >&2
  exit 1
fi
build=${MESHTENSOR_BUILD_DIR:-$root/build/translation}
bench_build_target "$build" translation
bin="$build/examples/translation"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OMP_PROC_BIND=false OPENBLAS_NUM_THREADS=1
mkdir -p "$out"
data="$out/data"
vocab=4000  # the SentencePiece model the example trains on its data (both sides read it)
model=(--vocab "$vocab" --d-model 128 --heads 4 --d-kv 32 --d-ff 512 --layers 2 --src-length 32 --tgt-length 32
       --dropout 0.1 --lr 1e-3 --batch "$batch" --steps "$steps")
log "$(lscpu | sed -n 's/^Model name: *//p'), OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset}, load $(cut -d' ' -f1-3 /proc/loadavg)"

bleu() {  # hypotheses references -> BLEU
  "$python" - "$1" "$2" <<'EOF'
import sys, sacrebleu
hyp = open(sys.argv[1], encoding="utf-8").read().splitlines()
ref = open(sys.argv[2], encoding="utf-8").read().splitlines()
print(f"{sacrebleu.corpus_bleu(hyp, [ref]).score:.2f}")
EOF
}

ours() {  # ranks layout rows cols tag
  local n=$1 layout=$2 r=$3 c=$4 tag=$5
  log "ours: $layout on $n rank(s), $steps steps"
  mpiexec -n "$n" "$bin" --layout "$layout" --mesh "$r" "$c" "${model[@]}" --data-dir "$data" --warmup 5 \
    --eval-every $((steps / 10 > 0 ? steps / 10 : 1)) --log-every 100 --csv "$out/$tag.csv" \
    --checkpoint "$out/$tag.ckpt" --hypotheses "$out/$tag.beam.txt" >"$out/$tag.log" 2>&1
  mpiexec -n "$n" "$bin" --layout "$layout" --mesh "$r" "$c" "${model[@]}" --data-dir "$data" --resume "$out/$tag.ckpt" \
    --decode greedy --hypotheses "$out/$tag.greedy.txt" >>"$out/$tag.log" 2>&1
}
ours 1 data 1 1 ours
log "PyTorch: $steps steps"
"$python" "$root/benchmarks/peers/torch_translation.py" "$data" --vocab "$vocab" --d-model 128 --heads 4 --d-ff 512 --layers 2 \
  --src-len 32 --tgt-len 32 --dropout 0.1 --lr 1e-3 --batch "$batch" --steps "$steps" --warmup 5 \
  --eval-every $((steps / 10 > 0 ? steps / 10 : 1)) --csv "$out/torch.csv" --json "$out/torch.json" >/dev/null 2>"$out/torch.log"
for layout in $layouts; do
  case "$layout" in
    model_parallel) ours 4 model_parallel 4 1 "$layout" ;;
    dp_mp) ours 4 dp_mp 2 2 "$layout" ;;
    data) ours 4 data 2 2 "$layout" ;;
  esac
done

ref="$out/ours.beam.txt.ref"
step_ms() { sed -n 's/^step_time_median_ms \([0-9.]*\).*/\1/p' "$1" | head -n 1; }
last_dev() { awk -F, 'NR > 1 && $3 != "" { d = $3 } END { printf "%.4f", d }' "$1"; }
tj() { "$python" -c "import json,sys; print(json.load(open('$out/torch.json'))[sys.argv[1]])" "$1"; }
echo "| run | median step (ms) | final dev loss | BLEU greedy | BLEU beam 4 |"
echo "|---|---|---|---|---|"
echo "| meshtensor, data layout, 1 rank | $(step_ms "$out/ours.log") | $(last_dev "$out/ours.csv") | $(bleu "$out/ours.greedy.txt" "$ref") | $(bleu "$out/ours.beam.txt" "$ref") |"
printf '| PyTorch nn.Transformer, 1 thread | %.1f | %.4f | %.2f | %.2f |\n' "$(tj median_step_ms)" "$(tj dev_loss)" \
  "$(tj bleu_greedy)" "$(tj bleu_beam)"
for layout in $layouts; do
  echo "| meshtensor, $layout, 4 ranks | $(step_ms "$out/$layout.log") | $(last_dev "$out/$layout.csv") | $(bleu "$out/$layout.greedy.txt" "$ref") | $(bleu "$out/$layout.beam.txt" "$ref") |"
done
echo "| copy the source | | | $(bleu "$out/ours.beam.txt.src" "$ref") | |"
decode_s() { sed -n 's/^decoded [0-9]* test sentences .* in \([0-9.]*\) s:.*/\1/p' "$1" | tail -n 1; }
printf 'decoding the test split (s): meshtensor, 1 rank: greedy %s, beam 4 %s; PyTorch: greedy %.1f, beam 4 %.1f\n' \
  "$(grep -h '(greedy' "$out/ours.log" | decode_s /dev/stdin)" "$(grep -h '(beam' "$out/ours.log" | decode_s /dev/stdin)" \
  "$(tj decode_greedy_seconds)" "$(tj decode_beam_seconds)"
echo "test sentences: $(wc -l <"$ref"); parameters: ours $(sed -n 's/^parameters: //p' "$out/ours.log" | head -n 1), PyTorch $(tj params)"
if command -v gnuplot >/dev/null; then
  gnuplot -e "set terminal png size 900,500; set output '$out/curves.png'; set datafile separator ',';
    set xlabel 'step'; set ylabel 'dev cross-entropy (nats/token)'; set title 'translation: dev loss' noenhanced;
    plot '$out/ours.csv' every ::1 using 1:3 with linespoints title 'meshtensor',
         '$out/torch.csv' every ::1 using 1:4 with linespoints title 'PyTorch'" 2>/dev/null &&
    echo "curves: $out/curves.png"
fi
