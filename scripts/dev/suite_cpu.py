#!/usr/bin/env python3
"""Where a test run's CPU goes, test by test, from the kernel's process accounting.

ctest's times are wall times. scripts/test.sh runs three tests per core, so on 2 cores a test's
wall time says more about what ran beside it than about what it costs, and a sum of wall times
over-counts the phase two- to threefold. Process accounting (acct(2), BSD's) records every process
as it ends: its parent, its start, its user and system CPU. Summed over the processes each test
started (its command and everything under it), that is what the test cost the machine.

    scripts/dev/suite_cpu.py run BUILD_DIR [ctest arguments]   # as root: accounting on, ctest, the table
    scripts/dev/suite_cpu.py on FILE                           # as root: accounting on, into FILE
    scripts/dev/suite_cpu.py off                               # and off
    scripts/dev/suite_cpu.py read FILE CTEST_OUTPUT            # the table of a run recorded in FILE

`on` and `off` around a whole `bash .ci/run` (its output kept) give the build's CPU and every
test's. The run's ctest output must hold ctest's "Start N: name" lines (any ctest run with -j).
The tests are matched to the processes ctest started in the order it started them (any it
started before the first test, a test discovery, set aside and shown). A process
whose parent ended before it (a daemon: Slurm's, an orphan) cannot be traced to a test: its CPU is
shown apart, as is all that ended before ctest started (the install and the build).
Needs CAP_SYS_PACCT (root) to switch accounting; reading a file needs nothing.
"""
import collections
import ctypes
import os
import re
import struct
import subprocess
import sys
import tempfile

RECORD = struct.Struct("<BBHIIIIIIf8H16s")  # struct acct_v3 (linux/acct.h): 64 bytes
TICKS = 100.0  # AHZ: the records' CPU times are in hundredths of a second


def expand(comp):
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (comp & 0x1FFF) << (3 * ((comp >> 13) & 7))


def records(path):
    data = open(path, "rb").read()
    out = []
    for off in range(0, len(data) - RECORD.size + 1, RECORD.size):
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, _etime, utime, stime, *_rest,
         comm) = RECORD.unpack_from(data, off)
        if version & 0x7F != 3:
            sys.exit(f"suite_cpu: {path} is not in the acct_v3 format (version {version & 0x7F})")
        out.append({"pid": pid, "ppid": ppid, "btime": btime, "cpu": (expand(utime) + expand(stime)) / TICKS,
                    "comm": comm.split(b"\0")[0].decode(errors="replace")})
    return out


def switch(path):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path else None) != 0:
        err = ctypes.get_errno()
        sys.exit(f"suite_cpu: acct({path!r}) failed: {os.strerror(err)} (process accounting needs root, "
                 "CAP_SYS_PACCT)")


def table(acct_path, ctest_output):
    recs = records(acct_path)
    started = [m.group(1) for m in re.finditer(r"^\s*Start\s+\d+: (.+?)\s*$", open(ctest_output).read(), re.M)]
    if not started:
        sys.exit(f"suite_cpu: no 'Start N: name' line in {ctest_output}")
    children = collections.Counter(r["ppid"] for r in recs)
    ctests = [r for r in recs if r["comm"] == "ctest"]
    if not ctests:
        sys.exit(f"suite_cpu: {acct_path} records no ctest (was accounting on until it ended?)")
    ctest = max(ctests, key=lambda r: children[r["pid"]])  # the run's, not a test's `ctest --print-labels`
    roots = sorted((r for r in recs if r["ppid"] == ctest["pid"]), key=lambda r: (r["btime"], r["pid"]))
    if len(roots) > len(started):  # ctest's own children before the first test: a PRE_TEST discovery
        set_aside = roots[:len(roots) - len(started)]
        print(f"set aside: {len(set_aside)} processes ctest started before its tests (a test discovery), "
              f"{sum(r['cpu'] for r in set_aside):.1f} s")
        roots = roots[len(set_aside):]
    if len(roots) != len(started):
        sys.exit(f"suite_cpu: ctest started {len(started)} tests but {len(roots)} processes are recorded as "
                 "its children: was accounting on for the whole run?")
    test_of = {r["pid"]: name for r, name in zip(roots, started)}
    by_pid = {}
    for r in recs:  # a pid used twice: the later process (records come in the order processes end)
        by_pid[r["pid"]] = r

    def owner(r):
        for _ in range(64):
            if r["pid"] in test_of and r["ppid"] == ctest["pid"]:
                return test_of[r["pid"]]
            parent = by_pid.get(r["ppid"])
            if parent is None or parent is r:
                return None
            r = parent
        return None

    cpu = collections.Counter()
    before, untraced = 0.0, 0.0
    untraced_by = collections.Counter()
    for r in recs:
        name = owner(r)
        if name is not None:
            cpu[name] += r["cpu"]
        elif r["btime"] < ctest["btime"] and r["pid"] != ctest["pid"]:
            before += r["cpu"]
        elif r["pid"] != ctest["pid"]:
            untraced += r["cpu"]
            untraced_by[r["comm"]] += r["cpu"]
    total = sum(cpu.values())
    print(f"CPU (user + system, s) of {len(started)} tests: {total:.0f}; ctest itself {ctest['cpu']:.0f}; "
          f"not traced to a test (daemons, orphans) {untraced:.0f}; before ctest started (install, build) {before:.0f}")
    if untraced_by:
        print("not traced, by command:", ", ".join(f"{c} {t:.1f}" for c, t in untraced_by.most_common(8)))
    groups = collections.Counter()
    for name, c in cpu.items():
        groups[name.split(".")[0]] += c
    print("\nby the name's first part:")
    for g, c in groups.most_common():
        print(f"{c:9.1f}  {100 * c / total:5.1f}%  {g}")
    print("\nthe 40 dearest tests:")
    for name, c in cpu.most_common(40):
        print(f"{c:9.1f}  {name}")


def main(argv):
    if len(argv) >= 2 and argv[0] == "on":
        open(argv[1], "ab").close()
        return switch(os.path.abspath(argv[1]))
    if argv[:1] == ["off"]:
        return switch(None)
    if len(argv) == 3 and argv[0] == "read":
        return table(argv[1], argv[2])
    if len(argv) >= 2 and argv[0] == "run":
        build, rest = argv[1], argv[2:]
        jobs = 3 * (os.cpu_count() or 1)  # as scripts/test.sh
        with tempfile.TemporaryDirectory() as d:
            acct, log = os.path.join(d, "acct"), os.path.join(d, "ctest.log")
            open(acct, "wb").close()
            switch(acct)
            try:
                with open(log, "w") as out:
                    subprocess.run(["ctest", "--test-dir", build, "-j", str(jobs), *rest], stdout=out,
                                   stderr=subprocess.STDOUT)
            finally:
                switch(None)
            print(open(log).read().splitlines()[-1] if os.path.getsize(log) else "")
            return table(acct, log)
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
