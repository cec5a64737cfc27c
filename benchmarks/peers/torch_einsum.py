#!/usr/bin/python3
"""PyTorch's einsum on bench_local's attention shapes (batch 4, heads 8, head size 64).

Prints one JSON object per line: {"name": "attn_qk/torch/<s>", "seconds": <mean per iteration>}.
Threads: torch.set_num_threads(MESHTENSOR_BENCH_THREADS, default 1), as the C++ side runs.
Runs with Debian's python3-torch (scripts/install_deps.sh --bench).
"""
import argparse
import json
import os
import time

import torch

B, H, D = 4, 8, 64


def bench(fn, iters):
    fn()  # warm-up
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="128,512")
    p.add_argument("--iters", type=int, default=0, help="0: as bench_local (40 at s<=128, else 4)")
    args = p.parse_args()
    threads = int(os.environ.get("MESHTENSOR_BENCH_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    for s in [int(v) for v in args.sizes.split(",")]:
        iters = args.iters or (40 if s <= 128 else 4)
        q = torch.randn(B, H, s, D)
        k = torch.randn(B, H, s, D)
        pm = torch.randn(B, H, s, s)
        with torch.no_grad():
            t_qk = bench(lambda: torch.einsum("bhqd,bhkd->bhqk", q, k), iters)
            t_av = bench(lambda: torch.einsum("bhqk,bhkd->bhqd", pm, k), iters)
        meta = {"threads": threads, "torch": torch.__version__}
        print(json.dumps({"name": f"attn_qk/torch/{s}", "seconds": t_qk, **meta}), flush=True)
        print(json.dumps({"name": f"attn_av/torch/{s}", "seconds": t_av, **meta}), flush=True)


if __name__ == "__main__":
    main()
