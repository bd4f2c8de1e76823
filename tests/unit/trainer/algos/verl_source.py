"""verl's own source at the pinned commit, for the scripts that record its functions' outputs as fixtures
(verl_*_golden.py): read from a git directory of verl, never at test time."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"


def git_show(repo: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{VERL_COMMIT}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def cut(source: str, names: set[str]) -> str:
    """The top-level functions named, without their decorators."""
    tree = ast.parse(source)
    found = {n.name: ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = names - set(found)
    assert not missing, missing
    return "\n\n\n".join(found[n] for n in sorted(names))


def write_fixture(out: Path, cases: dict[str, list[dict]]) -> None:
    """{"verl_commit", "cases": {kind: [case, ...]}}, one case a line (diffs stay readable)."""
    lines = [f'{{"verl_commit": "{VERL_COMMIT}", "cases": {{']
    for i, (kind, listed_cases) in enumerate(cases.items()):
        rows = ",\n".join(json.dumps(c) for c in listed_cases)
        lines.append(f'"{kind}": [\n{rows}\n]' + (",\n" if i < len(cases) - 1 else "\n"))
    out.write_text("".join(lines) + "}}\n")
    print(f"wrote {out}")
