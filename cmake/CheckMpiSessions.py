#!/usr/bin/env python3
"""Every test that starts isolated Open MPI singletons has session directories of its own.

Isolated singletons all take Open MPI's job family 0: two tests that start programs without mpiexec
at once would share /tmp/ompi.<host>.<uid>/jf.0, which one removes as it ends while the other
creates it (cmake/MeshtensorTesting.cmake, meshtensor_mpi_sessions_apart). This reads every test of
the tree as ctest would run it (`ctest --show-only=json-v1`, the discovered unit tests included) and
fails, naming them, on a test that isolates singletons without an OMPI_MCA_orte_tmpdir_base of its
own, or two tests that share one.

  CheckMpiSessions.py <ctest> <build dir>
"""
import json
import subprocess
import sys

ISOLATED = "OMPI_MCA_ess_singleton_isolated=1"
BASE = "OMPI_MCA_orte_tmpdir_base="


def main(ctest, build_dir):
    r = subprocess.run([ctest, "--show-only=json-v1"], cwd=build_dir, capture_output=True, text=True)
    if r.returncode != 0:
        print(f"ctest --show-only=json-v1 in {build_dir} failed ({r.returncode}):\n{r.stderr}")
        return 1
    owner = {}
    without, shared, unbuilt, isolated = [], [], [], 0
    for test in json.loads(r.stdout)["tests"]:
        if test["name"].endswith("_NOT_BUILT"):  # Catch's placeholder: the program's tests are unknown
            unbuilt.append(test["name"])
            continue
        env = next((p["value"] for p in test.get("properties", []) if p["name"] == "ENVIRONMENT"), [])
        if ISOLATED not in env:
            continue
        isolated += 1
        bases = [v[len(BASE):] for v in env if v.startswith(BASE)]
        if len(bases) != 1:
            without.append(test["name"])
            continue
        if bases[0] in owner:
            shared.append(f"{owner[bases[0]]} and {test['name']} ({bases[0]})")
        owner.setdefault(bases[0], test["name"])
    for name in without:
        print(f"{name}: isolates Open MPI singletons without a session directory of its own ({BASE}...)")
    for pair in shared:
        print(f"two tests share a session directory: {pair}")
    for name in unbuilt:
        print(f"{name}: its program is not built, so its tests (and their environment) cannot be read")
    if isolated == 0:
        print(f"no test isolates Open MPI singletons ({ISOLATED}): nothing was checked")
        return 1
    if without or shared or unbuilt:
        return 1
    print(f"{isolated} tests isolate Open MPI singletons, each with session directories of its own")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
