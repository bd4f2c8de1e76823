"""The one way the entrypoint talks to the user while it works: `rlrig: ...` lines on stderr.

stderr, so that stdout stays the command's own (and `doctor --json` stays one JSON object).
"""

from __future__ import annotations

import sys


def say(msg: str) -> None:
    print(f"rlrig: {msg}", file=sys.stderr, flush=True)


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """`rows` under `header` in left-aligned columns two spaces apart, one string a line (`rlrig status`'s tables)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows]]
