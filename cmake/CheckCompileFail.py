#!/usr/bin/env python3
"""Checks one compile_fail case against the compiler's output for the TU that held it.

    CheckCompileFail.py OUTPUT SOURCE [--unity UNITY_SOURCE]

The cases of tests/compile_fail are compiled together, one per namespace, in one TU
(cmake/WriteUnitySource.cmake; cmake/RunCompileFail.cmake saves what the compiler printed): the
TU's fixed cost is paid once instead of once per case. g++ goes on after an error, so every case
reports its own. This script splits OUTPUT into diagnostics (an error with the context printed
before it and the notes after it), gives each error to the case whose file or namespace some line
of it names, removes the namespace from the names (what a user's TU, with its dims at file scope,
would print) and the file locations from the lines (so that a regex is matched by what the
compiler says, not by a file's name), and checks SOURCE's errors: there is at least one (the case
does not compile), they match every "// expect: <regex>" line of SOURCE, and the first matches
every "// expect-first: <regex>" line (its sentence is not buried under errors before it). An
error given to no case, or to two, fails every check: the attribution is then in doubt. Without
--unity the whole output is SOURCE's.
"""
import argparse
import os
import re
import sys

LOCATION = r"\S+?:\d+:(\d+:)?"
# A line of the context g++ prints before a diagnostic: where it was included from, the function or
# instantiation it is in, the chain of instantiations that required it (with the ones it skipped).
CONTEXT = re.compile(rf"^In file included from |^\s+from \S+[:,]$|^[^ ]+: (In|At) .*:$"
                     rf"|^{LOCATION}\s+((recursively )?required |in .constexpr. expansion of |\[ skipping \d+ )")
HEADLINE = re.compile(rf"^{LOCATION} (error|warning|fatal error): ")
# What a line says without where: a location at its start, a file named by the context lines.
WHERE = re.compile(rf"^{LOCATION}\s*|^In file included from \S+|^\s+from \S+|^[^ ]+: (?=(In|At) )")


def diagnostics(lines):
    """The output as (kind, lines): each error or warning with the context printed before it and
    its notes and source lines after it. g++ prints a context once for the diagnostics in it: a
    diagnostic without one of its own is in the one before."""
    found, current, kind, pending, context = [], [], None, [], []
    for line in lines:
        headline = HEADLINE.search(line)
        if CONTEXT.search(line):
            pending.append(line)
        elif headline:
            if kind:
                found.append((kind, current))
            context = pending or context
            current, kind, pending = context + [line], headline.group(2), []
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
    # An output older than what it was compiled from is another build's (ctest -FS, -FA).
    inputs = [args.source] + ([args.unity] if args.unity else [])
    if any(os.path.getmtime(args.output) < os.path.getmtime(path) for path in inputs):
        sys.exit(f"{args.output} is older than {' or '.join(inputs)}: run compile_fail.compile first")
    output = open(args.output, encoding="utf-8", errors="replace").read()
    source_text = open(args.source, encoding="utf-8").read()
    expects = re.findall(r"^// expect: (.*)$", source_text, re.M)
    expect_firsts = re.findall(r"^// expect-first: (.*)$", source_text, re.M)
    if not expects:
        sys.exit(f"{args.source} has no '// expect: <regex>' line")

    errors = [text for kind, text in diagnostics(output.splitlines()) if kind != "warning"]
    if args.unity:
        members = unity_members(args.unity)
        index = next((i for i, path in members.items() if path == args.source), None)
        if index is None:
            sys.exit(f"{args.source} is not one of the cases compiled in {args.unity}")
        names = {i: re.compile(rf"meshtensor_unity_{i}_\w|{re.escape(path)}:") for i, path in members.items()}
        owners = [{i for i, name in names.items() if name.search("\n".join(text))} for text in errors]
        doubtful = [text for text, who in zip(errors, owners) if len(who) != 1]
        if doubtful:
            sys.exit(f"{len(doubtful)} of the {len(errors)} errors in {args.output} name no case or several; "
                     f"the first:\n" + "\n".join(doubtful[0]))
        errors = [text for text, who in zip(errors, owners) if index in who]
    if not errors:
        sys.exit(f"{args.source} compiled, but it must not (no error in {args.output} names the case)")
    namespace = re.compile(r"meshtensor_unity_\d+_\w+?::")
    said = [[namespace.sub("", WHERE.sub("", line)) for line in text] for text in errors]
    own = "\n".join("\n".join(text) for text in said)
    for regex in expects:
        if not re.search(regex, own):
            sys.exit(f"{args.source}: the compiler's errors for it do not match '{regex}'. They are:\n{own}")
        print(f"matched: {regex}")
    first = next(said[0][k] for k, line in enumerate(errors[0]) if HEADLINE.search(line))
    for regex in expect_firsts:
        if not re.search(regex, first):
            sys.exit(f"{args.source}: the compiler's first error for it does not match '{regex}'. It is:\n"
                     f"{first}\nIts errors:\n{own}")
        print(f"matched first error: {regex}")


if __name__ == "__main__":
    main()
