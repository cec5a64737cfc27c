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
The tests are matched to the processes ctest started in the order of their pids (which the
start second, too coarse, does not give), each match checked against ctest's time for the test;
tests ctest did not start are left out, and any process it started before the first test (a test
discovery) is set aside and shown. A process whose parent ended before it (a daemon: Slurm's,
an orphan) cannot be traced to a test: its CPU is shown apart, as is all that started before
ctest (the install and the build) and after it.
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
        (_flag, version, _tty, _exit, _uid, _gid, pid, ppid, btime, etime, utime, stime, *_rest,
         comm) = RECORD.unpack_from(data, off)
        if version & 0x7F != 3:
            sys.exit(f"suite_cpu: {path} is not in the acct_v3 format (version {version & 0x7F})")
        out.append({"pid": pid, "ppid": ppid, "btime": btime, "cpu": (expand(utime) + expand(stime)) / TICKS,
                    "comm": comm.split(b"\0")[0].decode(errors="replace"), "etime": etime / TICKS})
    return out


def switch(path):
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.acct(path.encode() if path else None) != 0:
        err = ctypes.get_errno()
        sys.exit(f"suite_cpu: acct({path!r}) failed: {os.strerror(err)} (process accounting needs root, "
                 "CAP_SYS_PACCT)")


def pid_max():
    try:
        return int(open("/proc/sys/kernel/pid_max").read())
    except OSError:
        return 4194304


def start_order(roots):
    """ctest's children in the order it started them: the order of their pids (a record's start
    second is too coarse, and two forks a millisecond apart can land in either order of it), a pid
    counted past pid_max after it wrapped (a drop of more than half the range, in start-second order)."""
    top = pid_max()
    unwrapped, last = [], None
    for r in sorted(roots, key=lambda r: (r["btime"], r["pid"])):
        if last is None:
            last = r["pid"]
        else:  # the pid's turn of the range nearest the previous one's
            base = last - last % top
            last = min((r["pid"] + base + k * top for k in (-1, 0, 1)), key=lambda u: abs(u - last))
        unwrapped.append((last, r))
    return [r for _, r in sorted(unwrapped, key=lambda t: t[0])]


def table(acct_path, ctest_output):
    recs = records(acct_path)
    text = open(ctest_output).read()
    # A test ctest did not start (disabled, its fixture failed, no executable) has a Start line but
    # no process: left out.
    not_run = set(re.findall(r"Test\s+#\d+: (.+?) \.*\s*\*+Not Run", text))
    seconds = {m.group(1): float(m.group(2))
               for m in re.finditer(r"Test\s+#\d+: (.+?) \.+.*?([0-9.]+) sec\s*$", text, re.M)}
    started = [m.group(1) for m in re.finditer(r"^\s*Start\s+\d+: (.+?)\s*$", text, re.M)]
    started = [n for n in started if n not in not_run]
    if not started:
        sys.exit(f"suite_cpu: no 'Start N: name' line in {ctest_output}")
    children = collections.Counter(r["ppid"] for r in recs)
    ctests = [r for r in recs if r["comm"] == "ctest"]
    if not ctests:
        sys.exit(f"suite_cpu: {acct_path} records no ctest (was accounting on until it ended?)")
    ctest = max(ctests, key=lambda r: children[r["pid"]])  # the run's, not a test's `ctest --print-labels`
    ctest_end = ctest["btime"] + ctest["etime"]
    roots = start_order([r for r in recs if r["ppid"] == ctest["pid"] and ctest["btime"] <= r["btime"] <= ctest_end])
    if len(roots) > len(started):  # ctest's own children before the first test: a PRE_TEST discovery
        set_aside = roots[:len(roots) - len(started)]
        print(f"set aside: {len(set_aside)} processes ctest started before its tests (a test discovery), "
              f"{sum(r['cpu'] for r in set_aside):.1f} s")
        roots = roots[len(set_aside):]
    if len(roots) != len(started):
        sys.exit(f"suite_cpu: ctest started {len(started)} tests but {len(roots)} processes are recorded as "
                 "its children: was accounting on for the whole run?")
    # The match checked: each process lived as long as ctest says its test took.
    apart = [n for r, n in zip(roots, started) if n in seconds and abs(r["etime"] - seconds[n]) > 1 + 0.05 * seconds[n]]
    if len(apart) > len(started) // 20:
        sys.exit(f"suite_cpu: {len(apart)} of {len(started)} tests did not last as long as the process matched "
                 f"to them (e.g. {apart[:3]}): the order of ctest's children is not its tests' order here")
    if apart:
        print(f"matched with doubt (the process's life differs from the test's time by more than 1 s + 5%): "
              f"{len(apart)} of {len(started)}")
    test_of = {id(r): name for r, name in zip(roots, started)}
    by_pid = collections.defaultdict(list)
    for r in recs:
        by_pid[r["pid"]].append(r)

    def parent_of(r):
        """The process with r's parent's pid that was alive when r started (pids are reused)."""
        alive = [p for p in by_pid.get(r["ppid"], ()) if p["btime"] <= r["btime"] <= p["btime"] + p["etime"] + 1]
        return max(alive, key=lambda p: p["btime"]) if alive else None

    def owner(r):
        for _ in range(64):
            if id(r) in test_of:
                return test_of[id(r)]
            parent = parent_of(r)
            if parent is None or parent is r:
                return None
            r = parent
        return None

    cpu = collections.Counter()
    before, after, untraced = 0.0, 0.0, 0.0
    untraced_by = collections.Counter()
    for r in recs:
        if r is ctest:
            continue
        name = owner(r)
        if name is not None:
            cpu[name] += r["cpu"]
        elif r["btime"] < ctest["btime"]:
            before += r["cpu"]
        elif r["btime"] > ctest_end:
            after += r["cpu"]
        else:
            untraced += r["cpu"]
            untraced_by[r["comm"]] += r["cpu"]
    total = sum(cpu.values())
    print(f"CPU (user + system, s) of {len(started)} tests: {total:.0f}, in {ctest['etime']:.0f} s of ctest's wall time; "
          f"ctest itself {ctest['cpu']:.0f}; not traced to a test (daemons, orphans) {untraced:.0f}; "
          f"before ctest started (install, build) {before:.0f}; after it {after:.0f}")
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
                    rc = subprocess.run(["ctest", "--test-dir", build, "-j", str(jobs), *rest], stdout=out,
                                        stderr=subprocess.STDOUT).returncode
            finally:
                switch(None)
            summary = re.findall(r"^.*tests passed.*$|^Total Test time.*$", open(log).read(), re.M)
            print("\n".join(summary) + (f"\nctest exited with {rc}" if rc else ""))
            table(acct, log)
            return rc
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
