"""Slurm hostlist expansion (the syntax `scontrol show hostnames` accepts).

Kept dependency-free because the batch script's first node may not have scontrol on PATH
inside a container.
"""

from __future__ import annotations

import re


class HostlistError(ValueError):
    pass


def _split_top_level(expr: str) -> list[str]:
    """Split on commas and whitespace that are outside brackets."""
    parts, depth, cur = [], 0, []
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        if depth == 0 and (ch == "," or ch.isspace()):
            if cur:
                parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth != 0:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    if cur:
        parts.append("".join(cur))
    return parts


def _expand_range_list(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip())
        if not m:
            raise HostlistError(f"bad range {item!r} in hostlist {expr!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise HostlistError(f"descending range {item!r} in hostlist {expr!r}")
        # Leading zeros on the lower bound fix the width of every number in the range.
        width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def _expand_one(name: str, expr: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", name)
    if not m:
        return [name]
    head, tail = name[: m.start()], name[m.end() :]
    # Several bracket groups in one name form a cartesian product, leftmost varying slowest.
    return [host for value in _expand_range_list(m.group(1), expr) for host in _expand_one(head + value + tail, expr)]


def expand_hostlist(expr: str) -> list[str]:
    """Expand `tux[0-2,5],login[01-02]` into host names, in order, duplicates kept."""
    hosts: list[str] = []
    for part in _split_top_level(expr.strip()):
        hosts.extend(_expand_one(part, expr))
    return hosts
