"""The one way the entrypoint talks to the user while it works: `rlrig: ...` lines on stderr.

stderr, so that stdout stays the command's own (and `doctor --json` stays one JSON object).
"""

from __future__ import annotations

import sys


def say(msg: str) -> None:
    print(f"rlrig: {msg}", file=sys.stderr, flush=True)
