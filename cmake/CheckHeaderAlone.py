#!/usr/bin/env python3
"""The compiler launcher of header.self_contained's TUs (tests/CMakeLists.txt).

Each TU includes its header twice, then ends in a static_assert that always fails, compiled with
-fsyntax-only -Wfatal-errors: g++ stops at that line, after the header's parse and before the end
of the TU, where it would instantiate every template the headers' inline functions use (2 s of
the 2.3 s of CPU a header took; the same runtime's maps and sorts in every header, instantiated
in full by every TU of the build). The TU passes when its one error is that static_assert. Any
error before it, in the header, is fatal first and fails the TU with g++'s message.

    CheckHeaderAlone.py COMPILER ARGS...   (CMake's CXX_COMPILER_LAUNCHER)

A compile whose source does not end in the marker (the precompiled header's) runs unchanged.
"""
import os
import re
import subprocess
import sys

MARKER = "meshtensor header check: the header parsed on its own"
# An error's own line, "file:line:column: error: ..." (not a quoted source line that says "error:").
ERROR_LINE = re.compile(r"^(?P<file>[^:\s][^:]*):\d+:\d+: (fatal )?error: ")


def source_of(command):
    if "-c" in command:
        index = command.index("-c")
        if index + 1 < len(command):
            return command[index + 1]
    return None


def ends_in_marker(source):
    try:
        with open(source, "rb") as text:
            lines = text.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return bool(lines) and MARKER in lines[-1]


def main():
    command = sys.argv[1:]
    if not command:
        sys.exit("CheckHeaderAlone.py: no compiler command given")
    source = source_of(command)
    if source is None or not ends_in_marker(source):
        os.execvp(command[0], command)
    if "-Wfatal-errors" not in command or "-fsyntax-only" not in command:
        sys.exit(f"CheckHeaderAlone.py: {source}: compile it with -fsyntax-only -Wfatal-errors "
                 "(the check relies on g++ stopping at the marker)")
    # Untranslated messages: the check reads g++'s "error:".
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          env={**os.environ, "LC_ALL": "C"})
    lines = done.stdout.decode("utf-8", errors="replace").splitlines()
    errors = [match for match in map(ERROR_LINE.match, lines) if match]
    reached_marker = (done.returncode != 0 and len(errors) == 1 and MARKER in errors[0].string
                      and os.path.basename(errors[0]["file"]) == os.path.basename(source))
    if reached_marker:
        # The marker's own lines go; anything g++ said before it (a warning) is shown.
        kept = lines[:lines.index(errors[0].string)]
        if kept and kept[-1].endswith("At global scope:"):
            kept.pop()
        if kept:
            print("\n".join(kept))
        return 0
    if lines:
        print("\n".join(lines))
    if done.returncode == 0:
        print(f"{source}: compiled without reaching the marker's static_assert: "
              "the header check proved nothing")
    else:
        print(f"{source}: the header failed on its own, before the marker (g++'s first error above)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
