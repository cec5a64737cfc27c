#!/usr/bin/env python3
"""Prints, one per line, the library's headers whose include closure holds every given header, a
system header or one of the library's (each reached through the header's own includes, the
library's included).

    python3 scripts/dev/headers_including.py include Kokkos_Core.hpp mpi.h

header.self_contained (tests/CMakeLists.txt) parses these from a precompiled header of the given
headers: for such a header the precompiled ones are what its own includes bring in anyway,
so a missing include still fails. The others are parsed from scratch.
"""
import os
import re
import sys

from check_include_graph import headers

INCLUDE = re.compile(r'^\s*#\s*include\s+([<"])([^>"]+)[>"]', re.M)


def includes_of(root):
    """Each header (relative to root) -> (the library headers it includes, the others it includes)."""
    found = {}
    for path, text in headers(root):
        own, other = [], []
        for kind, target in INCLUDE.findall(text):
            if kind == '"':
                own.append(os.path.normpath(os.path.join(os.path.dirname(path), target)).replace(os.sep, "/"))
            elif os.path.isfile(os.path.join(root, target)):
                own.append(target)
            else:
                other.append(target)
        found[path] = (own, other)
    return found


def closure_of(path, found, memo):
    if path in memo:
        return memo[path]
    memo[path] = set()  # a cycle contributes nothing twice
    own, other = found.get(path, ([], []))
    reached = set(other) | set(own)
    for inc in own:
        reached |= closure_of(inc, found, memo)
    memo[path] = reached
    return reached


def main(argv):
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, wanted = argv[1], set(argv[2:])
    found = includes_of(root)
    memo = {}
    for path in sorted(found):
        if wanted <= closure_of(path, found, memo):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
