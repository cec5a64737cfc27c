#!/usr/bin/env python3
"""Finds a check or a branch switched off by a constant in the project's C++ sources.

Planting a fault (the brief: "plant the fault a test is for, once, and see it fail") is done by
hand, most often as `if (false && ...)` or `#if 0`; committed by mistake, the check is dead and its
test fails in CI, or worse, the test goes with it. No code of the project needs such a constant
condition (`if constexpr` says what it means), so any is refused with its file and line.

    check_no_disabled_code.py ROOT...   exit 1 naming each hit
    check_no_disabled_code.py --self-test
"""
import pathlib
import re
import sys
import tempfile

SUFFIXES = {".hpp", ".cpp", ".h", ".cu"}
# A condition made constant by a literal: `if (false`, `false &&`, `&& false`, `true ||`,
# `|| true`, `if (0)`, `if (1)`, `#if 0`, `#if 1`.
DISABLED = re.compile(r"\bif\s*\(\s*(false|true|0|1)\s*[)&|]|\bfalse\s*&&|&&\s*false\b|\btrue\s*\|\||"
                      r"\|\|\s*true\b|^\s*#\s*if\s+[01]\b")


def hits(roots):
    found = []
    for root in map(pathlib.Path, roots):
        if not root.exists():
            sys.exit(f"check_no_disabled_code.py: {root}: no such directory")
        for path in sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file()):
            text = path.read_text(encoding="utf-8", errors="replace")
            for number, line in enumerate(text.splitlines(), 1):
                code = line.split("//", 1)[0]
                if DISABLED.search(code):
                    found.append(f"{path}:{number}: a condition made constant: {line.strip()}")
    return found


def self_test():
    planted = {
        "a.hpp": "if (false && !fits) throw e;\n",
        "b.cpp": "#if 0\nint x;\n#endif\n",
        "c.hpp": "if (ok || true) return;\n",
        "d.cpp": "if (0) f();\n",
    }
    clean = "if (fits && !done) throw e;  // if (false && x) in a comment is fine\nif constexpr (N > 0) g();\n"
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, text in planted.items():
            (root / name).write_text(text)
        (root / "clean.hpp").write_text(clean)
        found = hits([root])
        missed = [name for name in planted if not any(f"{name}:" in hit for hit in found)]
        wrong = [hit for hit in found if "clean.hpp" in hit]
        if missed or wrong or len(found) != len(planted):
            print("self-test failed: missed", missed, "flagged wrongly", wrong, "found", found)
            return 1
    print(f"self-test: the {len(planted)} planted conditions found, the clean file passed")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    found = hits(sys.argv[1:])
    for hit in found:
        print(hit)
    if found:
        print(f"{len(found)} condition(s) made constant: a planted fault left in, or code to delete")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
