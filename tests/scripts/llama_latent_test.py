"""examples/llama's multi-head latent attention (--kv-rank) against a reference written here from
DeepSeek-V2's equations (Liu et al. 2024, section 2.1), in float64 numpy.

llama_latent_test.py LLAMA MPIEXEC WORKDIR

A tiny model with latent attention in every block (2 KV heads of 2 query heads each, q_rank 32,
kv_rank 24, d_kv 16, d_rope 8) is made by the example from its seeds; one training step with a
learning rate of 0 saves its weights unchanged (--checkpoint). The reference reads them and computes
the logits of one sequence; the example's --logits-out of the same sequence, on one processor and
under --layout tensor on [2 x 2] (the heads over cols), must equal them to 1e-4 of their largest
magnitude (float32 against float64: about 1e-6); and its greedy generation of 6 tokens through the
compressed key-value cache (DeepSeek-V2's absorbed form) must be the reference's greedy tokens, on
one processor and with the heads over cols of [1 x 2]. Exit 77 (skipped) without numpy and
safetensors.
"""
import os
import shutil
import subprocess
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
except ImportError as e:
    print(f"SKIPPED: {e} (scripts/install_deps.sh installs them into its Python environment)")
    sys.exit(77)

llama, mpiexec, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
IDS = [3, 17, 42, 5, 0, 59, 23, 8, 31, 11, 47]
THETA, EPS = 500000.0, 1e-5  # the example's --rope-theta and --rms-eps defaults
MODEL = ["--layers", "2", "--d-model", "48", "--kv-heads", "2", "--group", "2", "--d-kv", "16", "--d-ff", "40",
         "--kv-rank", "24", "--q-rank", "32", "--d-rope", "8"]
text = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")


def run(ranks, *args):  # latent attention is built for --layout tensor ([1 x 1] on one processor)
    subprocess.run([mpiexec, "-n", str(ranks), llama, "--layout", "tensor", *MODEL, *args], check=True,
                   stdout=subprocess.DEVNULL)


run(1, "--text", text, "--steps", "1", "--lr", "0", "--checkpoint", os.path.join(work, "ckpt"), "--save-every", "1")
w = {k: v.astype(np.float64) for k, v in load_file(os.path.join(work, "ckpt", "step-00000001", "model.safetensors")).items()}


def rms(x, weight):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * weight


def rotated(x, positions):  # rotate-half rotary embedding along the last axis, Llama's convention
    d = x.shape[-1]
    angle = positions[:, None] * THETA ** (-np.arange(0, d, 2) / d)[None, :]
    cos, sin = np.cos(np.concatenate([angle, angle], -1)), np.sin(np.concatenate([angle, angle], -1))
    return x * cos + np.concatenate([-x[..., d // 2:], x[..., :d // 2]], -1) * sin


def reference_logits(ids):
    s = len(ids)
    pos = np.arange(s, dtype=np.float64)
    x = w["model.embed_tokens.weight"][ids]
    for b in range(2):
        at = lambda name: w[f"model.layers.{b}.{name}"]
        h = rms(x, at("input_layernorm.weight"))
        cq = rms(h @ at("self_attn.q_a_proj.weight").T, at("self_attn.q_a_layernorm.weight"))   # [s, q_rank]
        ckv = rms(h @ at("self_attn.kv_a_proj.latent").T, at("self_attn.kv_a_layernorm.weight"))  # [s, kv_rank]
        q_nope = np.einsum("sr,hgdr->hgsd", cq, at("self_attn.q_b_proj.nope"))
        q_rope = rotated(np.einsum("sr,hgdr->hgsd", cq, at("self_attn.q_b_proj.rope")), pos)
        k_rope = rotated(h @ at("self_attn.kv_a_proj.rope").T, pos)                               # [s, d_rope], all heads
        k_nope = np.einsum("sr,hdr->hsd", ckv, at("self_attn.kv_b_proj.k"))
        v = np.einsum("sr,hdr->hsd", ckv, at("self_attn.kv_b_proj.v"))
        scores = np.einsum("hgsd,htd->hgst", q_nope, k_nope) + np.einsum("hgsd,td->hgst", q_rope, k_rope)
        scores = scores / np.sqrt(q_nope.shape[-1] + q_rope.shape[-1])
        scores = np.where(np.tril(np.ones((s, s), dtype=bool)), scores, -np.inf)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + np.einsum("hgst,htd,mhgd->sm", p, v, at("self_attn.o_proj.weight"))
        h = rms(x, at("post_attention_layernorm.weight"))
        gate, up = h @ at("mlp.gate_proj.weight").T, h @ at("mlp.up_proj.weight").T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ at("mlp.down_proj.weight").T
    return rms(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


want = reference_logits(np.array(IDS))
ids = ["--ids", *map(str, IDS)]
failed = False
for ranks, layout in [(1, []), (4, ["--mesh", "2", "2"])]:
    out = os.path.join(work, f"logits{ranks}.txt")
    run(ranks, *layout, *ids, "--logits-out", out)
    got = np.loadtxt(out)
    error = np.abs(got - want).max() / np.abs(want).max()
    print(f"{ranks} rank(s) {' '.join(layout) or '(one processor)'}: largest difference {error:.2e} of the largest logit")
    failed |= not (got.shape == want.shape and error <= 1e-4)

# Greedy generation through the compressed cache (the absorbed form: no position's keys or values
# made again) against the reference's argmax of each longer sequence's last logits.
GENERATE = 6
sequence = list(IDS)
for _ in range(GENERATE):
    sequence.append(int(np.argmax(reference_logits(np.array(sequence))[-1])))
for ranks, layout in [(1, []), (2, ["--mesh", "1", "2"])]:
    out = os.path.join(work, f"generated{ranks}.txt")
    run(ranks, *layout, *ids, "--generate", str(GENERATE), "--generate-out", out)
    got = [int(t) for t in open(out).read().split()]
    print(f"{ranks} rank(s) generated {got}; the reference {sequence[len(IDS):]}")
    failed |= got != sequence[len(IDS):]
sys.exit(1 if failed else 0)
