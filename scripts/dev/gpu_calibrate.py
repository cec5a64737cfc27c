#!/usr/bin/env python3
"""What one GPU sustains, measured with PyTorch, for the cost model's calibration of a GPU machine
(scripts/dev/published_plans.py's H100 calibration takes its products' rates and memory rate from here;
the links between GPUs come from public specifications, since one GPU cannot measure them).

    python3 scripts/dev/gpu_calibrate.py [--out FILE.json] [--repeats N]

Measures, each as the median of N timed runs after warm-up (CUDA events around enough calls back to
back for about a teraFLOP, so that a small product's rate is the GPU's, not a launch's: the cost
model charges each kernel's fixed cost apart):
  - square products m = n = k in bf16 and in float32 (TF32 off: IEEE float32, as meshtensor computes),
    at 1024 to 16384, and ring attention's tile product (a query block of 65536 rows against 512
    keys of width 128): FLOP/s = 2 m n k / time;
  - the memory rate: a copy of 2 GiB (read and write: 2 x 2 GiB per copy);
  - an elementwise kernel's fixed cost: an add of 1024 floats, launched back to back.
"""
import argparse
import json
import statistics

import torch


def timed(fn, repeats, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_calibration.json")
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("gpu_calibrate.py: no CUDA device visible to PyTorch")
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
              "products": []}
    shapes = [(n, n, n) for n in (1024, 2048, 4096, 8192, 16384)] + [(65536, 512, 128)]
    for dtype, name in ((torch.bfloat16, "bf16"), (torch.float32, "float32")):
        for m, n, k in shapes:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            y = torch.randn(k, n, device=dev, dtype=dtype)
            z = torch.empty(m, n, device=dev, dtype=dtype)  # one result, written by every call
            calls = max(1, int(1e12 // (2 * m * n * k)))
            reps = a.repeats if m * n * k < 16384**3 or dtype == torch.bfloat16 else max(3, a.repeats // 3)

            def back_to_back():
                for _ in range(calls):
                    torch.mm(x, y, out=z)
            t = timed(back_to_back, reps) / calls
            result["products"].append({"dtype": name, "m": m, "n": n, "k": k, "calls_back_to_back": calls, "seconds": t,
                                       "flops_per_s": 2 * m * n * k / t})
            print(f"{name} {m} x {n} x {k}: {t * 1e3:.4f} ms each ({calls} back to back), "
                  f"{2 * m * n * k / t / 1e12:.1f} TFLOP/s", flush=True)
            del x, y, z
    src = torch.empty(2 << 30, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), a.repeats)
    result["copy_bytes"] = src.numel()
    result["copy_seconds"] = t
    result["memory_bytes_per_s"] = 2 * src.numel() / t  # read and written
    print(f"copy of 2 GiB: {t * 1e3:.3f} ms, {2 * src.numel() / t / 1e12:.2f} TB/s (read + write)", flush=True)
    del src, dst
    small = torch.ones(1024, device=dev)
    launches = 1000
    t = timed(lambda: [small.add_(1.0) for _ in range(launches)], max(3, a.repeats // 2))
    result["seconds_per_kernel"] = t / launches
    print(f"elementwise kernel, 1024 floats: {t / launches * 1e6:.2f} us each, back to back", flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
