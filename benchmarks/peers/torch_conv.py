#!/usr/bin/python3
"""PyTorch's conv2d on bench_conv's shapes: 3x3, padding same, forward and backward (input and weight).

Prints one JSON object per line: {"name": "conv2d/torch/<b>x<hw>x<c>", "seconds": <median per iteration>}.
Threads: torch.set_num_threads(MESHTENSOR_BENCH_THREADS, default 1), as one rank of bench_conv runs.
Runs with Debian's python3-torch.
"""
import json
import os
import statistics
import sys
import time

import torch

SHAPES = [(8, 32, 16), (8, 64, 32), (4, 128, 16)]


def main():
    torch.set_num_threads(int(os.environ.get("MESHTENSOR_BENCH_THREADS", "1")))
    torch.manual_seed(0)
    iters = int(os.environ.get("MESHTENSOR_BENCH_ITERS", "10"))
    shapes = [(1, 8, 2)] if os.environ.get("MESHTENSOR_BENCH_SMOKE") == "1" else SHAPES
    for b, hw, c in shapes:
        # channels last, as meshtensor's [b, h, w, c]
        x = torch.randn(b, c, hw, hw).to(memory_format=torch.channels_last).requires_grad_()
        wgt = (0.1 * torch.randn(c, c, 3, 3)).requires_grad_()
        gy = torch.randn(b, c, hw, hw).to(memory_format=torch.channels_last)

        def step():
            y = torch.nn.functional.conv2d(x, wgt, padding="same")
            gx, gw = torch.autograd.grad((y * gy).sum(), (x, wgt))
            return gx, gw

        step()  # warm-up
        times = []
        for _ in range(iters):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        print(json.dumps({"name": f"conv2d/torch/{b}x{hw}x{c}", "seconds": statistics.median(times)}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
