#!/usr/bin/python3
"""The meshtensor-lm model (tools/lm/model.hpp) written again in PyTorch.

Run it with Debian's python3-torch and python3-numpy (/usr/bin/python3).

  torch_reference.py check DIR [--tolerance 1e-4]
      DIR holds what `meshtensor-lm --dump DIR` wrote: the initial weights, the first batch, its
      loss and the gradients of that loss. Recomputes the loss and the gradients in float32 from
      the same weights and batch and compares. Exit 0 when the loss and every gradient agree to the
      tolerance (relative: |ours - torch| / |torch| for the loss, max|ours - torch| / max|torch|
      per gradient tensor), 1 when not, 77 when PyTorch is missing (ctest counts it as skipped).

  torch_reference.py bench [--batch 8 --length 128 --d-model 256 --heads 4 --d-kv 64 --d-ff 1024
                            --vocab 1024 --warmup 3 --steps 10 --threads 1]
      Times the training step (forward, backward, Adam) and prints
      step_time_median_ms <ms> over <n> steps after <w> warm-up steps.

The conventions are meshtensor's, stated explicitly where PyTorch's defaults differ: layer norm
with eps 1e-6 (biased variance), attention logits scaled by 1/sqrt(d_kv) on q, a causal mask that
adds -1e9 (not -inf) above the diagonal, ReLU feed-forward without biases, no biases in the
attention projections, learned positions added to the embeddings, a final layer norm and an
untied softmax projection, mean cross-entropy over batch and length, Adam with bias correction
(betas 0.9, 0.98, eps 1e-9 as meshtensor-lm).
"""
import argparse
import math
import sys
import time

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"torch_reference.py: {e}; install Debian's python3-torch and python3-numpy", file=sys.stderr)
    sys.exit(77)

N_LAYERS = 2
BLOCK_PARAMS = ["ln1_scale", "ln1_bias", "wq", "wk", "wv", "wo", "ln2_scale", "ln2_bias", "w_in", "w_out"]


def param_names(layers=N_LAYERS):
    names = ["embedding", "positions"]
    for b in range(layers):
        names += [f"blocks.{b}.{n}" for n in BLOCK_PARAMS]
    return names + ["lnf_scale", "lnf_bias", "softmax_weights"]


EPS = 1e-6
MASKED = -1e9


def layer_norm(x, scale, bias):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], scale, bias, eps=EPS)


def loss_fn(p, ids, labels, mask, dropout=0.0):
    """p: dict name -> tensor with meshtensor's dim orders; ids, labels: int64 [batch, length];
    dropout on each sublayer's output before its residual add (as meshtensor's blocks)."""
    drop = lambda t: torch.nn.functional.dropout(t, dropout, training=True) if dropout > 0 else t  # noqa: E731
    x = torch.nn.functional.embedding(ids, p["embedding"]) + p["positions"]  # [b, l, d_model]
    for b in range(N_LAYERS):
        w = lambda n: p[f"blocks.{b}.{n}"]  # noqa: E731
        h = layer_norm(x, w("ln1_scale"), w("ln1_bias"))
        d_kv = w("wq").shape[2]
        q = torch.einsum("bld,dhk->bhlk", h, w("wq")) * (1.0 / math.sqrt(d_kv))
        k = torch.einsum("bmd,dhk->bhmk", h, w("wk"))
        v = torch.einsum("bmd,dhk->bhmk", h, w("wv"))
        logits = torch.einsum("bhlk,bhmk->bhlm", q, k) + mask
        o = torch.einsum("bhlm,bhmk->bhlk", torch.softmax(logits, dim=-1), v)
        x = x + drop(torch.einsum("bhlk,hkd->bld", o, w("wo")))
        f = layer_norm(x, w("ln2_scale"), w("ln2_bias"))
        x = x + drop(torch.relu(f @ w("w_in")) @ w("w_out"))
    logits = layer_norm(x, p["lnf_scale"], p["lnf_bias"]) @ p["softmax_weights"]  # [b, l, vocab]
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def causal_mask(n, dtype=torch.float32):
    pos = torch.arange(n)
    return torch.where(pos[None, :] > pos[:, None], torch.tensor(MASKED, dtype=dtype), torch.tensor(0.0, dtype=dtype))


def check(args):
    d = args.dir
    names = param_names()
    p = {n: torch.from_numpy(np.load(f"{d}/param.{n}.npy")).requires_grad_() for n in names}
    ids = torch.from_numpy(np.load(f"{d}/ids.npy")).long()
    labels = torch.from_numpy(np.load(f"{d}/labels.npy")).long()
    ours_loss = float(np.load(f"{d}/loss.npy"))
    loss = loss_fn(p, ids, labels, causal_mask(ids.shape[1]))
    loss.backward()
    worst = abs(ours_loss - loss.item()) / abs(loss.item())
    print(f"loss: ours {ours_loss:.8f}  torch {loss.item():.8f}  rel diff {worst:.2e}")
    print(f"{'gradient':28s} {'shape':18s} {'max|torch|':>11s} {'max|diff|':>11s} {'rel(max)':>9s} {'rel(norm)':>9s}")
    for n in names:
        ours = torch.from_numpy(np.load(f"{d}/grad.{n}.npy"))
        ref = p[n].grad
        if ours.shape != ref.shape:
            print(f"{n}: shape {tuple(ours.shape)} but torch's is {tuple(ref.shape)}")
            return 1
        diff = (ours - ref).abs().max().item()
        scale = ref.abs().max().item()
        rel = diff / scale if scale > 0 else (0.0 if diff == 0 else math.inf)
        rel_norm = (ours - ref).norm().item() / max(ref.norm().item(), 1e-30)
        worst = max(worst, rel) if not math.isnan(rel) else math.inf
        print(f"{n:28s} {str(tuple(ref.shape)):18s} {scale:11.3e} {diff:11.3e} {rel:9.2e} {rel_norm:9.2e}")
    ok = worst <= args.tolerance
    print(f"largest relative difference: {worst:.2e} (tolerance {args.tolerance:.0e}): {'agree' if ok else 'DISAGREE'}")
    return 0 if ok else 1


def bench(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    dev = torch.device(args.device)
    # A GPU runs asynchronously: a step's time is taken after it has finished there.
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dm, h, kv, ff, V, L = args.d_model, args.heads, args.d_kv, args.d_ff, args.vocab, args.length
    shapes = {"embedding": (V, dm), "positions": (L, dm), "lnf_scale": (dm,), "lnf_bias": (dm,),
              "softmax_weights": (dm, V)}
    for b in range(N_LAYERS):
        shapes.update({f"blocks.{b}.ln1_scale": (dm,), f"blocks.{b}.ln1_bias": (dm,), f"blocks.{b}.wq": (dm, h, kv),
                       f"blocks.{b}.wk": (dm, h, kv), f"blocks.{b}.wv": (dm, h, kv), f"blocks.{b}.wo": (h, kv, dm),
                       f"blocks.{b}.ln2_scale": (dm,), f"blocks.{b}.ln2_bias": (dm,), f"blocks.{b}.w_in": (dm, ff),
                       f"blocks.{b}.w_out": (ff, dm)})
    p = {}
    for n, s in shapes.items():
        if n.endswith("_scale"):
            t = torch.ones(s)
        elif n.endswith("_bias"):
            t = torch.zeros(s)
        else:
            t = torch.randn(s) * 0.1
        p[n] = t.to(dev).requires_grad_()
    opt = torch.optim.Adam(p.values(), lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    mask = causal_mask(L).to(dev)
    # bf16: autocast's mixed precision (products in bf16, float parameters and optimizer), what a
    # PyTorch user runs; --compile: torch.compile's step, the next mark after eager.
    forward = torch.compile(loss_fn) if args.compile else loss_fn
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    times = []
    for step in range(args.warmup + args.steps):
        t0 = time.perf_counter()
        ids = torch.randint(0, V, (args.batch, L), device=dev)
        labels = torch.randint(0, V, (args.batch, L), device=dev)
        opt.zero_grad(set_to_none=True)
        with amp:
            loss = forward(p, ids, labels, mask, args.dropout)
        loss.backward()
        opt.step()
        loss.item()
        sync()
        times.append(time.perf_counter() - t0)
    timed = sorted(times[args.warmup:])
    n = len(timed)
    median = timed[n // 2] if n % 2 else 0.5 * (timed[n // 2 - 1] + timed[n // 2])
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{torch.get_num_threads()} thread(s)"
    print(f"torch {torch.__version__}, {where}, {args.dtype}{' (autocast)' if args.dtype == 'bf16' else ''}"
          f"{', torch.compile' if args.compile else ', eager'}")
    print(f"step_time_median_ms {1e3 * median:.3f} over {n} steps after {args.warmup} warm-up steps")
    if dev.type == "cuda":
        # PyTorch's caching allocator's peak over the run (parameters, Adam state, gradients and
        # activations): what meshtensor-lm --check-plan's measured peak is compared with.
        print(f"peak_memory_mib {torch.cuda.max_memory_allocated(dev) / 2**20:.1f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--tolerance", type=float, default=1e-4)
    b = sub.add_parser("bench")
    for name, default in [("batch", 8), ("length", 128), ("d-model", 256), ("heads", 4), ("d-kv", 64), ("d-ff", 1024),
                          ("vocab", 1024), ("warmup", 3), ("steps", 10), ("threads", 1)]:
        b.add_argument(f"--{name}", type=int, default=default)
    b.add_argument("--lr", type=float, default=2e-3)
    b.add_argument("--dropout", type=float, default=0.0, help="on each sublayer's output, as meshtensor-lm --dropout")
    b.add_argument("--device", default="cpu", help="cpu, or cuda for the GPU (scripts/gpu_check.sh)")
    b.add_argument("--dtype", default="float32", choices=["float32", "bf16"], help="bf16: under autocast")
    b.add_argument("--compile", action="store_true", help="the step's forward through torch.compile")
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else bench(args)


if __name__ == "__main__":
    sys.exit(main())
