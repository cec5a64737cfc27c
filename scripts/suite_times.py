#!/usr/bin/env python3
"""The suite's time by phase, against its budget (scripts/suite_budget.json).

scripts/test.sh calls it after ctest with the seconds of each phase; it reads each test's time
from ctest's cost file (Testing/Temporary/CTestCostData.txt: name, runs, mean seconds), prints the
phases, the labels' sums and the slowest tests, writes suite_times.json into the build tree, and,
where the whole suite ran, says which phase is over its share when the total is over the budget.
It reports; it never fails the run (a slow machine is not a broken library).

  suite_times.py --build-dir DIR --install S --build S --tests S [--whole] [--cpu NAME]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def test_costs(build_dir):
    """{test name: seconds of its last run} from ctest's cost file (empty when there is none)."""
    path = os.path.join(build_dir, "Testing", "Temporary", "CTestCostData.txt")
    costs = {}
    if not os.path.exists(path):
        return costs
    with open(path) as f:
        for line in f:
            if line.startswith("---"):  # the failed tests' list follows
                break
            parts = line.split()
            if len(parts) == 3:
                costs[parts[0]] = float(parts[2])
    return costs


def test_labels(build_dir):
    """{test name: [labels]} from `ctest --show-only=json-v1`."""
    try:
        out = subprocess.run(["ctest", "--test-dir", build_dir, "--show-only=json-v1"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return {}
    labels = {}
    for t in json.loads(out).get("tests", []):
        for p in t.get("properties", []):
            if p.get("name") == "LABELS":
                labels[t["name"]] = p.get("value", [])
    return labels


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--install", type=float, required=True, help="seconds: install_deps.sh (both Kokkos prefixes)")
    ap.add_argument("--build", type=float, required=True, help="seconds: configure and build")
    ap.add_argument("--tests", type=float, required=True, help="seconds: ctest, wall")
    ap.add_argument("--whole", action="store_true", help="the whole suite ran (no ctest filter): judge the budget")
    ap.add_argument("--budget", default=os.path.join(HERE, "suite_budget.json"))
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    with open(args.budget) as f:
        budget = json.load(f)
    costs = test_costs(args.build_dir)
    labels = test_labels(args.build_dir)
    cuda = costs.get("cuda_build", 0.0)
    phases = {"install": args.install, "build": args.build, "cuda_build": cuda,
              "tests": max(args.tests - cuda, 0.0)}  # cuda_build's own seconds, the rest of the phase's wall beside
    # (with twice as many test slots as cores it runs beside other tests: the split is approximate)
    total = args.install + args.build + args.tests
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            if m:
                cpu = m.group(1).strip()
    except OSError:
        pass
    by_label = {}
    for name, secs in costs.items():
        for label in labels.get(name, ["(none)"]):
            by_label[label] = by_label.get(label, 0.0) + secs

    print(f"\nsuite phases on {os.cpu_count()} cores of {cpu}:")
    for name, secs in phases.items():
        share = budget["phases"].get(name)
        print(f"  {name:<11} {secs:7.0f} s" + (f"   (share {share} s)" if share is not None else ""))
    print(f"  {'total':<11} {total:7.0f} s = {total / 60:.1f} min   (budget {budget['total'] / 60:.0f} min)")
    print("test seconds by label (a test counts under each of its labels; ctest -j runs some side by side):")
    for label, secs in sorted(by_label.items(), key=lambda kv: -kv[1]):
        print(f"  {label:<17} {secs:7.0f} s")
    print(f"the {args.top} slowest tests:")
    for name, secs in sorted(costs.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"  {secs:7.1f} s  {name}")

    result = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
              "phases": phases, "total": total, "whole_suite": args.whole,
              "by_label": by_label, "tests": costs}
    with open(os.path.join(args.build_dir, "suite_times.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    if args.whole and total > budget["total"]:
        grown = [(n, s - budget["phases"][n]) for n, s in phases.items() if s > budget["phases"].get(n, float("inf"))]
        grown.sort(key=lambda kv: -kv[1])
        what = ", ".join(f"{n} by {d:.0f} s" for n, d in grown) or "no single phase (each within its share)"
        print(f"suite: OVER the {budget['total'] / 60:.0f}-minute budget by {total - budget['total']:.0f} s; "
              f"over their shares: {what} (docs/performance.md, \"The suite's time\")")
    elif args.whole:
        print(f"suite: within the {budget['total'] / 60:.0f}-minute budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
