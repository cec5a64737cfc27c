#!/usr/bin/env python3
"""Checks one compile_fail case against the compiler's output for the TU that held it.

    CheckCompileFail.py OUTPUT SOURCE [--unity UNITY_SOURCE]

The cases of tests/compile_fail are compiled together, one per namespace, in one TU
(cmake/WriteUnitySource.cmake; cmake/RunCompileFail.cmake saves what the compiler printed): one
load of the precompiled header instead of one per case. g++ goes on after an error, so every case
reports its own. This script takes from OUTPUT the errors that belong to SOURCE (an error's
instantiation context or its types name the case's file or its namespace), removes the namespace
from the names (what a user's TU, with its dims at file scope, would print), and checks them: there
is at least one (the case does not compile), they match every "// expect: <regex>" line of SOURCE,
and the case's first error matches every "// expect-first: <regex>" line (its sentence is not buried
under errors that come before it). Without --unity the whole output is SOURCE's.
"""
import argparse
import re
import sys

# A line that opens a diagnostic: where it was included from, the function or instantiation it is
# in, the chain of instantiations that required it.
CONTEXT = re.compile(r"^In file included from |^\s+from \S+[:,]$|^[^ ]+: (In|At) .*:$"
                     r"|^\S.*:\d+:\d+:\s+((recursively )?required |in .constexpr. expansion of )|^\[ skipping \d+ instantiation contexts")
HEADLINE = re.compile(r"^\S.*?:\d+:(\d+:)? (error|warning|fatal error): ")


def diagnostics(lines):
    """The output as (kind, lines): each error or warning with its context before it and its notes
    and source lines after it. A note's own context goes with the note."""
    found, current, kind, pending = [], [], None, []
    for line in lines:
        headline = HEADLINE.search(line)
        if CONTEXT.search(line):
            pending.append(line)
        elif headline:
            if kind:
                found.append((kind, current))
            current, kind, pending = pending + [line], headline.group(2), []
        else:
            current += pending + [line]
            pending = []
    if kind:
        found.append((kind, current + pending))
    return found


def unity_members(unity):
    """{namespace index: source path} from a file written by WriteUnitySource.cmake."""
    text = open(unity, encoding="utf-8").read()
    return {int(index): path for index, path in
            re.findall(r'namespace meshtensor_unity_(\d+)_\w+ \{\n#include "([^"]+)"', text)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("source")
    parser.add_argument("--unity")
    args = parser.parse_args()
    output = open(args.output, encoding="utf-8", errors="replace").read()
    source_text = open(args.source, encoding="utf-8").read()
    expects = re.findall(r"^// expect: (.*)$", source_text, re.M)
    expect_firsts = re.findall(r"^// expect-first: (.*)$", source_text, re.M)
    if not expects:
        sys.exit(f"{args.source} has no '// expect: <regex>' line")

    errors = [text for kind, text in diagnostics(output.splitlines()) if kind != "warning"]
    namespace = re.compile(r"meshtensor_unity_\d+_\w+?::")
    if args.unity:
        members = unity_members(args.unity)
        index = next((i for i, path in members.items() if path == args.source), None)
        if index is None:
            sys.exit(f"{args.source} is not one of the cases compiled in {args.unity}")
        mine = re.compile(rf"meshtensor_unity_{index}_\w|{re.escape(args.source)}:")
        errors = [text for text in errors if mine.search("\n".join(text))]
    if not errors:
        sys.exit(f"{args.source} compiled, but it must not (no error of the compiler's output in "
                 f"{args.output} is the case's)")
    own = namespace.sub("", "\n".join("\n".join(text) for text in errors))
    for regex in expects:
        if not re.search(regex, own):
            sys.exit(f"{args.source}: the compiler's errors for it do not match '{regex}'. They are:\n{own}")
        print(f"matched: {regex}")
    first = namespace.sub("", next(line for line in errors[0] if HEADLINE.search(line)))
    for regex in expect_firsts:
        if not re.search(regex, first):
            sys.exit(f"{args.source}: the compiler's first error for it does not match '{regex}'. It is:\n"
                     f"{first}\nIts errors:\n{own}")
        print(f"matched first error: {regex}")


if __name__ == "__main__":
    main()
