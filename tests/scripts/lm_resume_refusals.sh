#!/usr/bin/env bash
# lm_resume_refusals.sh LM MPIEXEC WORKDIR: meshtensor-lm refuses to resume, by name, (1) on
# another --text than the checkpoint's (the batches drawn again would come from another stream)
# and (2) from a checkpoint whose metadata lacks a key it reads (here data_position, removed from
# the safetensors header).
set -euo pipefail
lm=$1 mpiexec=$2 dir=$3
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir"
small=(--mesh 1 1 --d-model 16 --heads 2 --d-kv 8 --d-ff 32 --layers 1 --batch 2 --length 16 --log-every 1000)
head -c 4096 /usr/share/common-licenses/GPL-3 >a.txt
head -c 4096 /usr/share/common-licenses/Apache-2.0 >b.txt
"$mpiexec" -n 1 "$lm" "${small[@]}" --text a.txt --steps 2 --checkpoint ckpt --save-every 2 >/dev/null
# refused RUN_ARGS... EXPECTED: the run fails (non-zero) and says EXPECTED
refused() {
  local expected=${*: -1} out rc=0
  out=$("$mpiexec" -n 1 "$lm" "${small[@]}" --steps 4 --resume ckpt "${@:1:$#-1}" 2>&1) || rc=$?
  if [ "$rc" = 0 ] || ! grep -qF -- "$expected" <<<"$out"; then
    echo "FAIL: expected a refusal saying: $expected (exit $rc); got:"; echo "$out"; exit 1
  fi
  echo "refused (exit $rc): $expected"
}
refused --text b.txt "the checkpoint was trained on --text a.txt, this run on --text b.txt"
python3 - ckpt/"$(cat ckpt/latest)"/model.safetensors <<'PY'
import json, struct, sys
path = sys.argv[1]
raw = open(path, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
header = json.loads(raw[8:8 + n])
del header['__metadata__']['data_position']
text = json.dumps(header).encode()
text += b' ' * (-len(text) % 8)  # the header's length a multiple of 8, as writers keep it
open(path, 'wb').write(struct.pack('<Q', len(text)) + text + raw[8 + n:])
PY
refused --text a.txt "has no 'data_position'"
