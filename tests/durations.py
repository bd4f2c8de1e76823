"""Where the test run's time went: each tier's wall time and test count, then its slowest tests, read from the
junit files tests/run.sh keeps in test-reports/. tests/run.sh prints this at the end of every run (CI's too).

    python tests/durations.py test-reports/*.xml [--top N]
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def cases(path: Path) -> tuple[float, list[tuple[float, str, str]]]:
    """A junit file's wall time and its test cases as (seconds, outcome, node id)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    wall, out = sum(float(s.get("time", 0)) for s in suites), []
    for case in root.iter("testcase"):
        outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        out.append((float(case.get("time", 0)), outcome, name))
    return wall, out


def summary(paths: list[Path], top: int) -> str:
    lines, slow = ["== test durations (tests/run.sh tiers)"], []
    total = 0.0
    for path in paths:
        wall, tier = cases(path)
        total += wall
        counts: dict[str, int] = {}
        for _, outcome, _ in tier:
            counts[outcome] = counts.get(outcome, 0) + 1
        said = ", ".join(f"{n} {k}" for k, n in sorted(counts.items()))
        lines.append(f"{path.stem:<14} {wall / 60:6.1f} min  {said}")
        slow += [(t, path.stem, name) for t, _, name in tier]
    lines.append(f"{'all tiers':<14} {total / 60:6.1f} min")
    lines.append(f"-- the {top} slowest tests")
    lines += [f"{t:8.1f}s  {tier:<12} {name}" for t, tier, name in sorted(slow, reverse=True)[:top]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("reports", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=30)
    a = p.parse_args(argv)
    found = [r for r in a.reports if r.is_file()]
    if not found:
        print("tests/durations.py: no junit report was written (a tier did not start)", file=sys.stderr)
        return 0
    print(summary(found, a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
