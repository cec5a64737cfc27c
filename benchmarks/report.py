#!/usr/bin/python3
"""Aggregates the raw results of scripts/dev/bench.sh: a table, results/<date>.json, plots in docs/.

  report.py RAW_DIR OUT_JSON PLOT_DIR

RAW_DIR holds round<i>-<what>.json files: Google Benchmark JSON (--benchmark_out) of the C++
binaries, JSON lines of the Python peers, and compile.json lines {name, seconds}. Every benchmark
is named <comparison>/<side>/<size>; the np<N> of the file name is appended to the comparison of
MPI runs. For each benchmark: median, min and max over the rounds. Each comparison pairs ours with
one peer; ratio = peer time / our time, so higher is better (> 1: we are faster).
"""
import collections
import glob
import json
import os
import re
import statistics
import sys


def load(raw):
    times = collections.defaultdict(list)  # (comparison, side, size) -> seconds per round
    labels, context = {}, {}
    for path in sorted(glob.glob(os.path.join(raw, "round*-*.json"))):
        base = os.path.basename(path)
        m = re.search(r"-np(\d+)", base)
        suffix = f".np{m.group(1)}" if m else ""
        text = open(path).read().strip()
        if not text:
            continue
        if text.startswith("{") and '"benchmarks"' in text[:20000]:
            doc = json.loads(text)
            # The executable's path names the machine's checkout; keep only the binary's name.
            ctx = dict(doc.get("context", {}))
            if "executable" in ctx:
                ctx["executable"] = os.path.basename(ctx["executable"])
            context.setdefault(base.split("-", 1)[1], ctx)
            for b in doc["benchmarks"]:
                if b.get("run_type") != "iteration" or b.get("error_occurred"):
                    continue
                comp, side, size = b["name"].split("/")[:3]
                scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b.get("time_unit", "ns")]
                key = (comp + suffix, side, int(size))
                times[key].append(b["real_time"] * scale)
                labels[key] = b.get("label", side)
        else:
            for line in text.splitlines():
                line = line.strip()
                if not line.startswith("{"):
                    continue
                r = json.loads(line)
                comp, side, size = r["name"].split("/")[:3]
                key = (comp + suffix, side, int(size))
                times[key].append(r["seconds"])
                labels[key] = r.get("label", side)
    return times, labels, context


PEER_NAMES = {
    "cblas_sgemm": "OpenBLAS cblas_sgemm",
    "eigen": "Eigen 3.4 Tensor contract (per b,h)",
    "torch": "PyTorch einsum",
    "sgemm_loop": "cblas_sgemm loop (per b,h)",
    "psgemm": "ScaLAPACK psgemm",
    "jax": "JAX jit + NamedSharding (4 CPU devices)",
    "mtf": "Mesh-TensorFlow placement mesh (4 CPU devices)",
    "mpi": "raw MPI",
    "ideal": "1-rank cblas_sgemm / min(ranks, cores) (ideal scaling)",
    "plain": "plain Kokkos + MPI + cblas TU",
}


def stats(v):
    return statistics.median(v), min(v), max(v)


def comparisons(times):
    """[(comparison, size, peer_side)] for every ours/peer pair present, plus parallel efficiency."""
    out = []
    keys = set(times)
    for (comp, side, size) in sorted(keys):
        if side != "ours":
            continue
        for (c2, s2, z2) in sorted(keys):
            if c2 == comp and z2 == size and s2 != "ours":
                out.append((comp, size, s2))
        # JAX and Mesh-TF run the 2x2 products and the MLP as one process of 4 devices.
        base = comp.split(".np")[0]
        if comp.endswith(".np4") and base in ("dist_matmul_2d", "mlp"):
            for peer in ("jax", "mtf"):
                if (base, peer, size) in keys:
                    out.append((comp, size, peer))
        if base.startswith("dist_matmul") and ("matmul", "cblas_sgemm", size) in keys:
            out.append((comp, size, "ideal"))
    return out


def peer_times(times, comp, size, peer):
    if peer in ("jax", "mtf") and (comp, peer, size) not in times:
        return times[(comp.split(".np")[0], peer, size)]
    if peer == "ideal":
        # Ideal scaling over the cores the ranks share: 4 ranks on 2 cores can at best halve it.
        p = min(int(comp.split(".np")[1]), os.cpu_count() or 1)
        return [t / p for t in times[("matmul", "cblas_sgemm", size)]]
    return times[(comp, peer, size)]


def unit_of(comp):
    base = comp.split(".np")[0]
    if base in ("allreduce", "allgather", "alltoall", "reduce_sum", "gather_relayout", "relayout"):
        return "us", 1e6
    if base.startswith("compile"):
        return "s", 1.0
    return "ms", 1e3


def human_size(comp, size):
    base = comp.split(".np")[0]
    if base in ("allreduce", "allgather", "alltoall", "reduce_sum", "gather_relayout", "relayout"):
        return f"{size >> 20} MiB" if size >= (1 << 20) else f"{size >> 10} KiB"
    if base.startswith("attn"):
        return f"b4 h8 s{size} d64"
    if base == "mlp":
        return "512x512x2048x512"
    if base.startswith("compile"):
        return "-"
    return f"{size}^3"


def main():
    raw, out_json, plot_dir = sys.argv[1:4]
    times, labels, context = load(raw)
    rows, entries = [], []
    for comp, size, peer in comparisons(times):
        ours_v, peer_v = times[(comp, "ours", size)], peer_times(times, comp, size, peer)
        if not ours_v or not peer_v:
            continue
        unit, scale = unit_of(comp)
        o, omin, omax = stats(ours_v)
        p, pmin, pmax = stats(peer_v)
        ratio = p / o
        name = comp + ("" if peer != "ideal" else ".efficiency")
        entries.append({"name": name, "size": size, "size_text": human_size(comp, size), "ours": o * scale,
                        "ours_min": omin * scale, "ours_max": omax * scale, "peer": p * scale,
                        "peer_min": pmin * scale, "peer_max": pmax * scale, "peer_name": PEER_NAMES.get(peer, peer),
                        "unit": unit, "ratio": ratio, "rounds": len(ours_v),
                        "ratio_meaning": "parallel efficiency: (1-rank sgemm time / min(ranks, cores)) / our time" if peer == "ideal"
                        else "peer time / our time (higher is better)"})
        rows.append((name, human_size(comp, size), f"{o*scale:.3g} [{omin*scale:.3g}, {omax*scale:.3g}]",
                     f"{p*scale:.3g} [{pmin*scale:.3g}, {pmax*scale:.3g}]", PEER_NAMES.get(peer, peer), unit,
                     f"{ratio:.2f}"))
    # Compile times with no peer (the examples).
    for (comp, side, size), v in sorted(times.items()):
        if comp.startswith("compile_example"):
            o, omin, omax = stats(v)
            entries.append({"name": comp, "size": size, "size_text": "-", "ours": o, "ours_min": omin,
                            "ours_max": omax, "peer": None, "peer_name": None, "unit": "s", "ratio": None,
                            "rounds": len(v)})
            rows.append((comp, "-", f"{o:.3g} [{omin:.3g}, {omax:.3g}]", "-", "-", "s", "-"))

    head = ("comparison", "size", "ours median [min, max]", "peer median [min, max]", "peer", "unit",
            "ratio")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    fmt = " | ".join("{:<%d}" % w for w in widths)
    table = [fmt.format(*head), "-+-".join("-" * w for w in widths)] + [fmt.format(*r) for r in rows]
    print("\n".join(table))

    env = {k: os.environ.get(k, "(unset)") for k in
           ("OPENBLAS_CORETYPE", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MESHTENSOR_BENCH_THREADS")}
    meta = {"environment": env, "load_before": os.environ.get("MESHTENSOR_BENCH_LOAD_BEFORE"),
            "load_after": os.environ.get("MESHTENSOR_BENCH_LOAD_AFTER"),
            "command": os.environ.get("MESHTENSOR_BENCH_COMMAND"), "machine": os.environ.get("MESHTENSOR_BENCH_MACHINE"),
            "benchmark_context": context}
    with open(out_json, "w") as f:
        json.dump({"meta": meta, "comparisons": entries}, f, indent=1)
    with open(os.path.splitext(out_json)[0] + ".md.tmp", "w") as f:
        f.write("| " + " | ".join(head) + " |\n|" + "---|" * len(head) + "\n")
        for r in rows:
            f.write("| " + " | ".join(str(x) for x in r) + " |\n")
    plots(entries, plot_dir)


def plots(entries, plot_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib missing (python3-matplotlib), no plots", file=sys.stderr)
        return
    by = collections.defaultdict(list)
    for e in entries:
        if e["ratio"] is not None:
            by[e["name"]].append(e)

    # 1. Ratios of every comparison (one bar each), grouped.
    groups = [("Local einsum (1 rank)", lambda n: n.startswith(("matmul", "attn"))),
              ("Distributed products", lambda n: n.startswith(("dist_matmul", "mlp"))),
              ("Compile time", lambda n: n.startswith("compile"))]
    fig, axes = plt.subplots(1, len(groups), figsize=(16, 6), gridspec_kw={"width_ratios": [3, 3, 1]})
    for ax, (title, pred) in zip(axes, groups):
        sel = [e for e in entries if e["ratio"] is not None and pred(e["name"])]
        labels = [f"{e['name']} {e['size_text']}\nvs {e['peer_name'].split(' (')[0]}" for e in sel]
        ax.barh(range(len(sel)), [e["ratio"] for e in sel], color=["tab:green" if e["ratio"] >= 1 else "tab:red" for e in sel])
        ax.set_yticks(range(len(sel)))
        ax.set_yticklabels(labels, fontsize=6)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xscale("log")
        ax.set_title(title)
        ax.set_xlabel("peer time / our time (log; > 1: we are faster)")
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(os.path.join(plot_dir, "bench_ratios.png"), dpi=110)
    plt.close(fig)

    # 2. Communication: time vs size, ours and raw MPI, per collective and rank count.
    comm = ["allreduce", "allgather", "alltoall", "reduce_sum", "gather_relayout", "relayout"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, c in zip(axes.flat, comm):
        for np_, style in (("np2", "-"), ("np4", "--")):
            es = sorted(by.get(f"{c}.{np_}", []), key=lambda e: e["size"])
            if not es:
                continue
            x = [e["size"] / 2**20 for e in es]
            ax.plot(x, [e["ours"] for e in es], "o" + style, color="tab:blue", label=f"meshtensor {np_}")
            ax.plot(x, [e["peer"] for e in es], "s" + style, color="tab:orange", label=f"raw MPI {np_}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(c)
        ax.set_xlabel("MiB per rank")
        ax.set_ylabel("us (median)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(plot_dir, "bench_collectives.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
