"""Mesh-TensorFlow itself (mesh-tensorflow on tensorflow-cpu, graph mode) on a placement mesh of 4
CPU devices, rows:2 x cols:2: the distributed matrix product and the two-layer MLP step of
bench_dist, same shapes, same layout rules, float32.

  matmul: layout m:rows;k:cols (C's slices stay on their devices, as meshtensor's do)
  mlp:    layout batch:rows;hidden:cols; loss = sum((relu(x w1) w2)^2), mtf.gradients of w1, w2

Inputs are mtf variables (their slices live on the devices); each timed step computes the lowered
slices of the results and fetches one element of each. Session: 4 CPU devices,
intra_op_parallelism_threads=1 (one thread per op, like one MPI rank with OMP_NUM_THREADS=1),
inter_op_parallelism_threads=MESHTENSOR_BENCH_INTER_OP (default 4: the 4 devices' ops at once).
Prints one JSON object per line: {"name": ..., "seconds": <mean per iteration>}.
"""
import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow.compat.v1 as tf  # noqa: E402

tf.disable_v2_behavior()
import mesh_tensorflow as mtf  # noqa: E402

DEVICES = ["/cpu:%d" % i for i in range(4)]


def session_config():
    return tf.ConfigProto(device_count={"CPU": 4}, intra_op_parallelism_threads=1,
                          inter_op_parallelism_threads=int(os.environ.get("MESHTENSOR_BENCH_INTER_OP", "4")),
                          allow_soft_placement=False)


def run_graph(build, layout, iters):
    """build(mesh) -> list of mtf tensors to compute. Returns seconds per step."""
    tf.reset_default_graph()
    graph = mtf.Graph()
    mesh = mtf.Mesh(graph, "mesh")
    outs = build(mesh)
    mesh_impl = mtf.placement_mesh_impl.PlacementMeshImpl(
        mtf.convert_to_shape("rows:2;cols:2"), mtf.convert_to_layout_rules(layout), DEVICES)
    lowering = mtf.Lowering(graph, {mesh: mesh_impl})
    slices = []
    for o in outs:
        slices += lowering.tensors[o].to_laid_out_tensor().all_slices
    # One element of each slice is fetched: that computes every slice (a tf.group of the slices
    # was pruned to nothing here: it ran in 0.2 ms for a 1024^3 product) and moves 4 bytes each.
    step = [tf.reshape(x, [-1])[0] for x in slices]
    with tf.Session(config=session_config()) as sess:
        sess.run(tf.global_variables_initializer())
        sess.run(lowering.copy_masters_to_slices())
        sess.run(step)  # warm-up
        t0 = time.perf_counter()
        for _ in range(iters):
            sess.run(step)
        return (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1024,2048")
    ap.add_argument("--mlp", default="512,512,2048,512", help="batch,din,hidden,dout")
    ap.add_argument("--iters", type=int, default=0)
    args = ap.parse_args()
    meta = {"tensorflow": tf.__version__, "mesh_tensorflow": getattr(mtf, "__version__", "0.1.21")}
    init = tf.random_normal_initializer()
    for s in [int(v) for v in args.sizes.split(",")]:
        def build(mesh, s=s):
            m, k, n = mtf.Dimension("m", s), mtf.Dimension("k", s), mtf.Dimension("n", s)
            a = mtf.get_variable(mesh, "a", [m, k], initializer=init)
            b = mtf.get_variable(mesh, "b", [k, n], initializer=init)
            return [mtf.einsum([a, b], output_shape=[m, n])]
        t = run_graph(build, "m:rows;k:cols", args.iters or (6 if s <= 1024 else 2))
        print(json.dumps({"name": f"dist_matmul_2d/mtf/{s}", "seconds": t, **meta}), flush=True)

    nb, ni, nh, no = [int(v) for v in args.mlp.split(",")]

    def build_mlp(mesh):
        b_, i_, h_, o_ = (mtf.Dimension("batch", nb), mtf.Dimension("din", ni), mtf.Dimension("hidden", nh),
                          mtf.Dimension("dout", no))
        x = mtf.get_variable(mesh, "x", [b_, i_], initializer=init)
        w1 = mtf.get_variable(mesh, "w1", [i_, h_], initializer=tf.random_normal_initializer(stddev=0.05))
        w2 = mtf.get_variable(mesh, "w2", [h_, o_], initializer=tf.random_normal_initializer(stddev=0.05))
        hh = mtf.relu(mtf.einsum([x, w1], output_shape=[b_, h_]))
        y = mtf.einsum([hh, w2], output_shape=[b_, o_])
        loss = mtf.reduce_sum(mtf.square(y))
        return [loss] + mtf.gradients([loss], [w1, w2])
    t = run_graph(build_mlp, "batch:rows;hidden:cols", args.iters or 5)
    print(json.dumps({"name": f"mlp/mtf/{nb}", "seconds": t, **meta}), flush=True)


if __name__ == "__main__":
    main()
