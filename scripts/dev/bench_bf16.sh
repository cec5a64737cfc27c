#!/usr/bin/env bash
# bf16 and float32 products, one rank: meshtensor's einsum (benchmarks/bench_bf16.cpp) against
# PyTorch's matmul on one thread (benchmarks/peers/torch_matmul.py), in interleaved rounds; each
# figure is the median over the rounds of each run's median. Prints a Markdown table, the CPU's
# bf16 flags and oneDNN's ISA (also in the benchmark's JSON context), and a second table: float32
# products at the Transformer step's shapes through OpenBLAS and through oneDNN.
#
#   OPENBLAS_CORETYPE=... scripts/dev/bench_bf16.sh [--rounds N] [BUILD_DIR]
#
# BUILD_DIR (default $MESHTENSOR_BUILD_DIR or build/bench) is configured where it is not yet.
# On a CPU without AVX512_BF16 the table says so: bf16 then runs emulated (or widened to float),
# and the ratios are those of that fallback.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=bench_common.sh
source "$root/scripts/dev/bench_common.sh"
rounds=5
if [ "${1:-}" = "--rounds" ]; then rounds="$2"; shift 2; fi
build=${1:-${MESHTENSOR_BUILD_DIR:-$root/build/bench}}
log() { echo "[bench_bf16] $*" >&2; }
bench_build_target "$build" bench_bf16 -- -DMESHTENSOR_BUILD_TESTS=OFF
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_PROC_BIND=false
log "load average before: $(cut -d' ' -f1-3 /proc/loadavg) (1-minute above 0.5: not a quiet machine)"
raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
for r in $(seq 1 "$rounds"); do
  log "round $r/$rounds"
  mpiexec -n 1 "$build/benchmarks/bench_bf16" --benchmark_out="$raw/ours-$r.json" --benchmark_out_format=json >/dev/null
  /usr/bin/python3 "$root/benchmarks/peers/torch_matmul.py" >"$raw/torch-$r.json"
done
flags=$(grep -o -w -E 'avx512_bf16|amx_bf16|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')
/usr/bin/python3 - "$raw" "$rounds" "$flags" <<'PY'
import glob, json, os, statistics, sys
raw, rounds, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3].split()
ours, labels, context, providers = {}, {}, {}, {}
for f in glob.glob(f"{raw}/ours-*.json"):
    d = json.load(open(f))
    context = d["context"]
    for b in d["benchmarks"]:
        if b["name"].startswith("float_provider/"):
            _, s, ops, prov = b["name"].split("/")[:4]
            providers.setdefault((s, ops, prov), []).append(b["real_time"] / 1e3)
            continue
        _, t, s = b["name"].split("/")[:3]
        ours.setdefault((t, s), []).append(b["real_time"] / 1e3)
        labels[(t, s)] = b.get("label", "")
torch, torch_errors = {}, {}
for f in glob.glob(f"{raw}/torch-*.json"):
    for line in open(f):
        e = json.loads(line)
        _, t, s = e["name"].split("/")
        if e.get("seconds") is None:
            torch_errors[t.replace("torch-", "")] = e.get("error", "")
            continue
        torch.setdefault((t.replace("torch-", ""), s), []).append(e["seconds"])
print(f"products, one thread, medians of {rounds} rounds; CPU flags: {' '.join(flags) or 'none of avx512f/avx512_bf16/amx_bf16'}; "
      f"kernels: {context.get('kernels')}, oneDNN ISA: {context.get('onednn_isa', '-')}; "
      f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}")
if context.get("bf16_products", "").startswith("portable"):
    print(f"bf16 products are portable in this job (the ISA it agreed on: {context.get('cpu_isa_job', '-')}, below "
          "avx512_core): widened to float, OpenBLAS's sgemm, rounded once; slower than float32 here, as expected.")
elif "avx512_bf16" not in flags:
    print("This CPU lacks AVX512_BF16: oneDNN emulates bf16 on AVX-512; the ratios below are the emulation's.")
for t, err in torch_errors.items():
    print(f"PyTorch {t}: none here ({err}); its columns are nan.")
print()
print("| m x k x n | float32 ms (GFLOP/s) | bf16 ms (GFLOP/s) | bf16 / float32 speed | PyTorch bf16 ms | ours / PyTorch bf16 | PyTorch float32 ms | ours / PyTorch float32 | bf16 kernel |")
print("|---|---|---|---|---|---|---|---|---|")
for s in sorted({k[1] for k in ours}, key=lambda v: [int(x) for x in v.split("x")]):
    m, k, n = (int(x) for x in s.split("x"))
    gf = lambda t: 2 * m * k * n / t / 1e9
    f32 = statistics.median(ours[("float32", s)]); b16 = statistics.median(ours[("bf16", s)])
    tb = statistics.median(torch.get(("bf16", s), [float("nan")])); tf = statistics.median(torch.get(("float32", s), [float("nan")]))
    print(f"| {s} | {f32*1e3:.2f} ({gf(f32):.0f}) | {b16*1e3:.2f} ({gf(b16):.0f}) | {f32/b16:.2f}x | {tb*1e3:.2f} | {tb/b16:.2f}x | "
          f"{tf*1e3:.2f} | {tf/f32:.2f}x | {labels[('bf16', s)]} |")
if providers:
    print()
    print("float32 products at the Transformer step's shapes, each provider called directly (kernels::product "
          f"takes oneDNN for float when its ISA is AVX-512; here: {context.get('onednn_isa', '-')}):")
    print()
    print("| batch x m x k x n | op(a) op(b) | OpenBLAS ms (GFLOP/s) | oneDNN ms (GFLOP/s) | oneDNN / OpenBLAS speed |")
    print("|---|---|---|---|---|")
    for (s, ops) in sorted({(k[0], k[1]) for k in providers}):
        nb, m, k, n = (int(x) for x in s.split("x"))
        fl = 2 * nb * m * k * n / 1e9
        ob = statistics.median(providers.get((s, ops, "openblas"), [float("nan")]))
        od = statistics.median(providers.get((s, ops, "onednn"), [float("nan")]))
        print(f"| {s} | {ops} | {ob*1e3:.3f} ({fl/ob:.0f}) | {od*1e3:.3f} ({fl/od:.0f}) | {ob/od:.2f}x |")
PY
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg); cores: $(nproc --all)"
