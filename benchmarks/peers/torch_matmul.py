#!/usr/bin/python3
"""PyTorch's matmul on bench_bf16's shapes, float32 and bfloat16.

Prints one JSON object per line: {"name": "product/torch-<type>/<m>x<k>x<n>", "seconds": <median>}, or
"seconds": null and "error" where PyTorch cannot multiply that type here.
Threads: torch.set_num_threads(MESHTENSOR_BENCH_THREADS, default 1). Runs with Debian's python3-torch.
"""
import json
import os
import statistics
import time

import torch

SHAPES = [(512, 512, 512), (1024, 1024, 1024), (1024, 256, 1024)]


def main():
    torch.set_num_threads(int(os.environ.get("MESHTENSOR_BENCH_THREADS", "1")))
    torch.manual_seed(0)
    iters = int(os.environ.get("MESHTENSOR_BENCH_ITERS", "20"))
    shapes = [(8, 8, 8)] if os.environ.get("MESHTENSOR_BENCH_SMOKE") == "1" else SHAPES
    for m, k, n in shapes:
        for name, dtype in (("float32", torch.float32), ("bf16", torch.bfloat16)):
            a = torch.randn(m, k).to(dtype)
            b = torch.randn(k, n).to(dtype)
            try:
                torch.matmul(a, b)  # warm-up
            except RuntimeError as e:  # Debian's PyTorch has no bf16 matmul below AVX-512 (its oneDNN's)
                print(json.dumps({"name": f"product/torch-{name}/{m}x{k}x{n}", "seconds": None, "error": str(e)}))
                continue
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                torch.matmul(a, b)
                times.append(time.perf_counter() - t0)
            print(json.dumps({"name": f"product/torch-{name}/{m}x{k}x{n}", "seconds": statistics.median(times)}))


if __name__ == "__main__":
    main()
