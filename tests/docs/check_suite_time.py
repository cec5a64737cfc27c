#!/usr/bin/env python3
"""README's figure for the suite's time is the last measured run's (docs label, docs.suite_time).

benchmarks/results/suite-times.json is scripts/test.sh's suite_times.json of the last whole run
from a clean clone, with the date it ran; README.md's row for scripts/test.sh must quote its total
in minutes (one decimal) and its date, so that the figure is read from a measurement, not
remembered.

  check_suite_time.py README.md benchmarks/results/suite-times.json
"""
import json
import sys


def main(readme_path, times_path):
    with open(times_path) as f:
        times = json.load(f)
    with open(readme_path) as f:
        rows = [line for line in f if line.startswith("| `scripts/test.sh`")]
    if len(rows) != 1:
        print(f"{readme_path}: expected one table row for `scripts/test.sh`, found {len(rows)}")
        return 1
    total = f"{times['total'] / 60:.1f} min"
    missing = [s for s in (total, times["date"]) if s not in rows[0]]
    if missing:
        print(f"{readme_path}: the `scripts/test.sh` row does not quote the last measured suite "
              f"({times_path}: {total} on {times['date']}, {times['cpu']}); missing: {', '.join(missing)}")
        return 1
    print(f"README quotes the last measured suite: {total} on {times['date']}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
