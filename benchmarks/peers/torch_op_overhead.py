#!/usr/bin/env python3
"""PyTorch eager's cost of one op on tiny tensors: the peer of benchmarks/bench_op_overhead.cpp.

The same ops on the same 64 x 64 float tensors (and the transcendental functions at 4 K and 1 M
elements, float and bf16: math/...), each run CHAIN times in a row and the device
waited for once at the end, the median over ROUNDS rounds, in microseconds per op. With --ours
(bench_op_overhead's --benchmark_out JSON from the same device) it prints both side by side and
the ratio PyTorch / meshtensor (above 1: meshtensor is faster) and, beside it, meshtensor's same op
on a planned mesh (its door/ benchmarks: the door's checks and the plan's and tape's bookkeeping,
no kernel), and writes both to --out.

    python3 benchmarks/peers/torch_op_overhead.py --device cuda --ours ours.json --out both.json
"""
import argparse
import json
import re
import statistics
import sys
import time

import torch
import torch.nn.functional as F

SIDE = 64


def per_op(fn, chain, rounds, sync):
    for _ in range(chain):
        fn()
    sync()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(chain):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / chain)
    return 1e6 * statistics.median(times)


def measure(dev, chain, rounds):
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    g = torch.Generator(device="cpu").manual_seed(1)
    rand = lambda *s: torch.randn(*s, generator=g).to(dev)
    x, other, w = rand(SIDE, SIDE), rand(SIDE, SIDE), rand(SIDE, SIDE)
    scale, bias = torch.ones(SIDE, device=dev), torch.zeros(SIDE, device=dev)
    ops = {
        "add": lambda t: t + other,
        "exp": torch.exp,
        "exp_half": lambda t: torch.exp(t * 0.5),
        "einsum64": lambda t: torch.einsum("rc,ck->rk", t, w),
        "softmax": lambda t: torch.softmax(t, dim=1),
        "layer_norm": lambda t: F.layer_norm(t, (SIDE,), scale, bias, eps=1e-6),
    }
    out = {}
    with torch.no_grad():
        for name, op in ops.items():
            out[f"op/{name}/fwd"] = per_op(lambda: op(x), chain, rounds, sync)
    xg = x.clone().requires_grad_()
    for name, op in ops.items():
        out[f"op/{name}/fwd_bwd"] = per_op(lambda: torch.autograd.grad(op(xg).sum(), xg), chain, rounds, sync)
    math = {
        "exp": torch.exp,
        "log": torch.log,
        "tanh": torch.tanh,
        "sigmoid": torch.sigmoid,
        "gelu": lambda t: F.gelu(t, approximate="tanh"),
        "silu": F.silu,
    }
    for side in (64, 1024):
        n = side * side
        chain_here = max(2, chain * SIDE * SIDE // n)
        for dtype, type_name in ((torch.float32, "float"), (torch.bfloat16, "bf16")):
            u = (torch.rand(side, side, generator=g) + 0.5).to(dev).to(dtype)
            for name, op in math.items():
                with torch.no_grad():
                    out[f"math/{name}/{type_name}/{n}"] = per_op(lambda: op(u), chain_here, rounds, sync)
                if dtype == torch.float32:
                    ug = u.clone().requires_grad_()
                    out[f"math/{name}/{type_name}/{n}/fwd_bwd"] = per_op(
                        lambda: torch.autograd.grad(op(ug).sum(), ug), chain_here, rounds, sync)
    ps = [rand(1024).requires_grad_() for _ in range(64)]
    for q in ps:
        q.grad = rand(1024)
    step_opt = torch.optim.Adam(ps, foreach=True)
    out["op/adam_step/64x1024"] = per_op(step_opt.step, max(2, chain // 10), rounds, sync)
    p = rand(1024).requires_grad_()
    p.grad = rand(1024)
    opt = torch.optim.Adam([p])
    out["op/adam/1024"] = per_op(opt.step, chain, rounds, sync)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--chain", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=25)
    ap.add_argument("--ours", help="bench_op_overhead's --benchmark_out JSON, to print side by side")
    ap.add_argument("--out", help="JSON of both sides and the ratios")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    theirs = measure(dev, args.chain, args.rounds)
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU, {torch.get_num_threads()} thread(s)"
    ours, parts, door = {}, {}, {}
    if args.ours:
        with open(args.ours) as f:
            for b in json.load(f)["benchmarks"]:
                if b.get("run_type", "iteration") != "iteration":
                    continue
                us = b["real_time"] * {"us": 1, "ms": 1e3, "ns": 1e-3, "s": 1e6}[b["time_unit"]]
                name = re.sub(r"/(iterations:\d+|manual_time|real_time)", "", b["name"])
                if name.startswith("door/"):  # the op on a planned mesh: its time without kernels
                    door["op/" + name[len("door/"):]] = us
                else:
                    (parts if name.startswith("parts/") else ours)[name] = us
    print(f"per-op time, microseconds (median of {args.rounds} rounds of {args.chain}); torch {torch.__version__}, {where}")
    print(f"{'op':36s} {'meshtensor':>11s} {'PyTorch':>9s} {'PyTorch/ours':>13s} {'door+tape':>10s}")
    rows = []
    for name, t in theirs.items():
        o = ours.get(name)
        ratio = t / o if o else None
        d = door.get(name)
        rows.append({"op": name, "meshtensor_us": o, "pytorch_us": t, "pytorch_over_meshtensor": ratio,
                     "meshtensor_planned_us": d})
        print(f"{name:36s} {o if o is not None else float('nan'):11.2f} {t:9.2f} "
              f"{ratio if ratio is not None else float('nan'):13.2f} {d if d is not None else float('nan'):10.2f}")
    for name, t in parts.items():
        print(f"{name:36s} {t:11.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"torch": torch.__version__, "device": where, "chain": args.chain, "rounds": args.rounds,
                       "ops": rows, "meshtensor_parts_us": parts}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
