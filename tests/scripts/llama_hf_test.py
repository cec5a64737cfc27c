"""examples/llama against Hugging Face transformers' LlamaForCausalLM: the same checkpoint, the same
logits.

llama_hf_test.py LLAMA MPIEXEC WORKDIR

Two tiny Llamas are made with transformers (random weights, norms not all ones), each saved with
save_pretrained in shards (model.safetensors.index.json): one untied in float32 with 8 query heads
over 2 KV heads, a vocabulary of 300 and Llama 3.1's rope scaling; one with tied embeddings in
bfloat16. The example
reads each (--from-pretrained) under several layouts and rank counts, the sequence uneven over
them, and writes the logits of one sequence (--logits-out); they must equal those of transformers'
from_pretrained of the same directory in float32 (its eager attention; the bf16 weights upcast as
the example upcasts them) to 1e-5 of their largest magnitude
(float32 sums in other orders: about 1e-6). Its greedy generation of 32 tokens through its key-value
cache gives transformers' generate's tokens. Then the untied one is fine-tuned on 2 ranks for 20
steps and exported (--save-pretrained, sharded): transformers loads the export and its logits
equal the example's from it (and differ from the untrained model's); and the bf16 one is loaded and
exported in bf16 again, every tensor bit for bit. Exit 77 (skipped) without torch and transformers.
"""
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/install_deps.sh installs transformers into its Python environment)")
    sys.exit(77)

llama, mpiexec, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)  # nothing from an earlier run (a stale model.safetensors beside new shards)
os.makedirs(work)
IDS = [3, 17, 42, 5, 0, 59, 23, 8, 31, 11, 47]  # 11 positions: uneven over 2 and 4 parts


def make(name, dtype, shard="1GB", **config):
    torch.manual_seed(len(name))
    cfg = LlamaConfig(max_position_embeddings=64, attn_implementation="eager", **config)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                p.add_(1.0)
    model = model.to(dtype)
    path = os.path.join(work, name)
    model.save_pretrained(path, safe_serialization=True, max_shard_size=shard)
    # The reference: transformers loading the directory in float32 (bf16 weights upcast, as the
    # example upcasts them; its rotary frequencies computed in float32, not kept in bf16).
    reference = LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        logits = reference(torch.tensor([IDS])).logits[0].numpy()
    return path, logits


# Llama 3's shape in small: 8 query heads over 2 KV heads, a vocabulary of 300, rope_theta 500000
# with Llama 3.1's frequency scaling (its original context short enough that every branch of the
# scaling applies to some frequency), untied, float32 in three shards. And a second one, tied, in
# bf16, with transformers' default rope.
cases = [
    make("untied_f32", torch.float32, shard="200KB", vocab_size=300, hidden_size=64, intermediate_size=96,
         num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0,
         tie_word_embeddings=False,
         rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 2.0,
                       "original_max_position_embeddings": 16}),
    make("tied_bf16", torch.bfloat16, shard="20KB", vocab_size=61, hidden_size=32, intermediate_size=48,
         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=10000.0,
         tie_word_embeddings=True),
]
for path, _ in cases:
    if not os.path.exists(os.path.join(path, "model.safetensors.index.json")):
        print(f"FAIL: save_pretrained wrote no shards into {path}: the sharded case is not tested")
        sys.exit(1)

runs = [(1, ["--layout", "data", "--mesh", "1", "1"]),
        (2, ["--layout", "tensor", "--mesh", "1", "2"]),
        (2, ["--layout", "context", "--mesh", "1", "2"]),
        (4, ["--layout", "context", "--attention", "ring", "--mesh", "1", "4"]),
        (4, ["--layout", "context_tensor", "--attention", "ring", "--mesh", "2", "2"])]
failed = False
for path, want in cases:
    for ranks, layout in runs:
        out = os.path.join(work, f"{os.path.basename(path)}.{layout[1]}.np{ranks}.txt")
        cmd = [mpiexec, "-n", str(ranks), llama, "--from-pretrained", path, *layout, "--logits-out", out,
               "--ids", *map(str, IDS)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
            failed = True
            continue
        got = np.loadtxt(out).reshape(want.shape)
        error = float(np.abs(got - want).max() / np.abs(want).max())
        ok = error <= 1e-5
        failed |= not ok
        print(f"{'ok  ' if ok else 'FAIL'} {os.path.basename(path)} {' '.join(layout)} on {ranks}: "
              f"largest difference {error:.2e} of the largest logit")


# Greedy generation of 32 tokens after IDS: transformers' generate(do_sample=False) against the
# example's --generate (its key-value cache written in place), on 1 rank and on 2 (KV heads split).
reference = LlamaForCausalLM.from_pretrained(cases[0][0], torch_dtype=torch.float32, attn_implementation="eager")
reference.generation_config.eos_token_id = None  # 32 tokens whatever they are
with torch.no_grad():
    prompt = torch.tensor([IDS])  # its mask given: token 0 of IDS is no padding
    generated = reference.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                                   pad_token_id=0)
want_tokens = generated[0, len(IDS):].tolist()
for ranks, layout in runs[:2]:
    out = os.path.join(work, f"generated.{layout[1]}.np{ranks}.txt")
    cmd = [mpiexec, "-n", str(ranks), llama, "--from-pretrained", cases[0][0], *layout, "--generate", "32",
           "--generate-out", out, "--ids", *map(str, IDS)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    got_tokens = [int(t) for t in open(out).read().split()] if r.returncode == 0 else []
    ok = r.returncode == 0 and got_tokens == want_tokens
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} greedy generation of 32 tokens, {' '.join(layout)} on {ranks}: "
          + ("the same tokens as transformers' generate" if ok else
             f"exit {r.returncode}, {got_tokens} against transformers' {want_tokens}\n{r.stdout}{r.stderr}"))


def run(ranks, *args):
    cmd = [mpiexec, "-n", str(ranks), llama, *map(str, args)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL: {' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
        sys.exit(1)


def tensors(path):
    from safetensors.torch import load_file
    out = {}
    for f in sorted(os.listdir(path)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(path, f)))
    return out


# Fine-tuned on 2 ranks (tensor layout) for 20 steps, exported sharded: transformers loads the
# export unchanged, and its logits are the example's from the same directory (and no longer the
# untrained model's).
readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
export = os.path.join(work, "fine_tuned")
run(2, "--from-pretrained", cases[0][0], "--layout", "tensor", "--mesh", 1, 2, "--text", readme, "--steps", 20,
    "--batch", 2, "--length", 16, "--log-every", 100, "--save-pretrained", export, "--max-shard-bytes", 200000)
shards = [f for f in os.listdir(export) if f.startswith("model-")]
reference = LlamaForCausalLM.from_pretrained(export, torch_dtype=torch.float32, attn_implementation="eager")
with torch.no_grad():
    want = reference(torch.tensor([IDS])).logits[0].numpy()
out = os.path.join(work, "fine_tuned.txt")
run(1, "--from-pretrained", export, "--logits-out", out, "--ids", *IDS)
error = float(np.abs(np.loadtxt(out).reshape(want.shape) - want).max() / np.abs(want).max())
moved = float(np.abs(want - cases[0][1]).max() / np.abs(cases[0][1]).max())
ok = error <= 1e-5 and moved > 1e-3 and len(shards) > 1
failed |= not ok
print(f"{'ok  ' if ok else 'FAIL'} fine-tuned 20 steps on 2 ranks, exported in {len(shards)} shards: transformers' logits "
      f"{error:.2e} from the example's, {moved:.2e} from the untrained model's")

# bf16 loaded on 2 ranks (context layout) and exported again in bf16: every tensor bit for bit.
again = os.path.join(work, "bf16_again")
run(2, "--from-pretrained", cases[1][0], "--layout", "context", "--mesh", 1, 2, "--text", readme, "--steps", 0,
    "--save-pretrained", again, "--save-dtype", "bf16", "--max-shard-bytes", 20000)
original, written = tensors(cases[1][0]), tensors(again)
same = original.keys() == written.keys() and all(
    original[k].dtype == written[k].dtype and original[k].shape == written[k].shape and torch.equal(original[k], written[k])
    for k in original)
failed |= not same
print(f"{'ok  ' if same else 'FAIL'} bf16 round trip: {len(written)} tensors of {len(original)}, "
      f"{'bit for bit' if same else 'NOT equal: ' + ', '.join(sorted(set(original) ^ set(written)) or ['values'])}")
sys.exit(1 if failed else 0)
