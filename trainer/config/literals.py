"""Override values as Hydra reads them: the one reader for the command line, config files, interpolations and
the accepted-default comparisons of verl_keys."""

from __future__ import annotations

import ast
from typing import Any


def parse_literal(raw: str) -> Any:
    """Hydra-style literals: null/None, true/false, numbers, lists; anything else is a string."""
    low = raw.strip().lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        pass
    if raw.startswith("[") and raw.endswith("]"):  # [console,wandb] without quotes
        return [parse_literal(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
    return raw
