"""JAX on 4 CPU devices (a 2x2 Mesh with NamedSharding): the distributed matrix product and the
two-layer MLP step of bench_dist, same shapes, same layouts, float32.

  matmul: C[m,n] = A[m,k] B[k,n]; A P('rows','cols'), B P('cols',None), C P('rows',None)
  mlp:    loss = sum((relu(x w1) w2)^2), gradients of w1 and w2; x P('rows',None),
          w1 P(None,'cols'), w2 P('cols',None)

Prints one JSON object per line: {"name": ..., "seconds": <mean per iteration>}. Run in
.venv-bench (scripts/dev/bench_venv.sh). XLA_FLAGS must hold --xla_force_host_platform_device_count=4
before jax is imported; this script adds it when missing, and --xla_cpu_multi_thread_eigen=false so
each device computes on one thread, like one MPI rank with OMP_NUM_THREADS=1.
"""
import argparse
import json
import os
import time

flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in flags:
    flags += " --xla_force_host_platform_device_count=4"
if "xla_cpu_multi_thread_eigen" not in flags:
    flags += " --xla_cpu_multi_thread_eigen=false"
os.environ["XLA_FLAGS"] = flags.strip()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402


def bench(fn, iters):
    jax.block_until_ready(fn())  # warm-up (and compile)
    t0 = time.perf_counter()
    for _ in range(iters):
        jax.block_until_ready(fn())
    return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048")
    ap.add_argument("--mlp", default="512,512,2048,512", help="batch,din,hidden,dout")
    ap.add_argument("--iters", type=int, default=0)
    args = ap.parse_args()
    devs = np.array(jax.devices()[:4]).reshape(2, 2)
    mesh = Mesh(devs, ("rows", "cols"))
    sh = lambda *spec: NamedSharding(mesh, P(*spec))  # noqa: E731
    rng = np.random.default_rng(0)
    meta = {"jax": jax.__version__, "devices": len(jax.devices()), "xla_flags": os.environ["XLA_FLAGS"]}

    for s in [int(v) for v in args.sizes.split(",")]:
        a = jax.device_put(rng.standard_normal((s, s), dtype=np.float32), sh("rows", "cols"))
        b = jax.device_put(rng.standard_normal((s, s), dtype=np.float32), sh("cols", None))
        f = jax.jit(lambda a, b: a @ b, out_shardings=sh("rows", None))
        t = bench(lambda: f(a, b), args.iters or (6 if s <= 1024 else 2))
        print(json.dumps({"name": f"dist_matmul_2d/jax/{s}", "seconds": t, **meta}), flush=True)

    nb, ni, nh, no = [int(v) for v in args.mlp.split(",")]
    x = jax.device_put(rng.standard_normal((nb, ni), dtype=np.float32), sh("rows", None))
    w1 = jax.device_put(0.05 * rng.standard_normal((ni, nh), dtype=np.float32), sh(None, "cols"))
    w2 = jax.device_put(0.05 * rng.standard_normal((nh, no), dtype=np.float32), sh("cols", None))

    def loss(x, w1, w2):
        y = jax.nn.relu(x @ w1) @ w2
        return jnp.sum(y * y)

    step = jax.jit(jax.value_and_grad(loss, argnums=(1, 2)))
    t = bench(lambda: step(x, w1, w2), args.iters or 5)
    print(json.dumps({"name": f"mlp/jax/{nb}", "seconds": t, **meta}), flush=True)


if __name__ == "__main__":
    main()
