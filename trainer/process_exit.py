"""The end of an rlrig process: `rlrig` itself and the trainer's driver."""

from __future__ import annotations

import gc
import sys
from typing import NoReturn


def leave(code: int) -> NoReturn:
    """Exit with `code`, the interpreter's last garbage collection skipped: with torch, transformers and Ray loaded it
    takes about a second at the end of every run and frees nothing the exit does not. Only for a process's own end
    (the `__main__` of a command), never for a function that returns to a caller that goes on."""
    gc.freeze()
    sys.exit(code)
