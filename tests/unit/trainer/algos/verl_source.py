"""verl's own source, for the scripts that record its functions' outputs as fixtures (verl_*_golden.py), never read
at test time: at the pinned commit from a git directory of verl (git_show), or at the reference release from its
unpacked wheel (wheel_show), fetched with

    mkdir -p /tmp/verlwheel && cd /tmp/verlwheel && pip download --no-deps verl==0.9.1 && unzip -o -q verl-0.9.1-*.whl
"""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

VERL_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
VERL_RELEASE = "0.9.1"  # the reference release: its wheel's verl/ sources


def git_show(repo: str, path: str) -> str:
    return subprocess.run(
        ["git", "-C", repo, "show", f"{VERL_COMMIT}:{path}"], check=True, capture_output=True, text=True
    ).stdout


def wheel_show(root: str, path: str) -> str:
    """`path` (verl/...) from verl's wheel unpacked at `root`; the wheel must be VERL_RELEASE's."""
    found = sorted(p.name for p in Path(root).glob("verl-*.dist-info"))
    assert found == [f"verl-{VERL_RELEASE}.dist-info"], f"{root} holds {found}, not verl {VERL_RELEASE}'s wheel"
    return (Path(root) / path).read_text()


def cut(source: str, names: set[str]) -> str:
    """The top-level functions named, without their decorators."""
    tree = ast.parse(source)
    found = {n.name: ast.get_source_segment(source, n) for n in tree.body if isinstance(n, ast.FunctionDef)}
    missing = names - set(found)
    assert not missing, missing
    return "\n\n\n".join(found[n] for n in sorted(names))


def write_fixture(out: Path, cases: dict[str, list[dict]], release: bool = False) -> None:
    """{"verl_commit" (or with release, "verl_release"), "cases": {kind: [case, ...]}}, one case a line (diffs stay
    readable)."""
    source = f'"verl_release": "{VERL_RELEASE}"' if release else f'"verl_commit": "{VERL_COMMIT}"'
    lines = [f'{{{source}, "cases": {{']
    for i, (kind, listed_cases) in enumerate(cases.items()):
        rows = ",\n".join(json.dumps(c) for c in listed_cases)
        lines.append(f'"{kind}": [\n{rows}\n]' + (",\n" if i < len(cases) - 1 else "\n"))
    out.write_text("".join(lines) + "}}\n")
    print(f"wrote {out}")


class VerlConfig(dict):
    """Stands in for verl's ActorConfig/CriticConfig dataclasses where its loss functions read them: attributes,
    `.get` and `global_batch_info`."""

    __getattr__ = dict.__getitem__


def load_core_algos(root: str, names: set[str]) -> dict:
    """verl VERL_RELEASE's core_algos.py functions `names`, executed with verl_F's masked_sum, masked_mean,
    clip_by_value and entropy_from_logits (torch_functional.py) from the wheel unpacked at `root`: a namespace."""
    from typing import Any, Optional

    import torch

    verl_f = type(ast)("verl_F")
    verl_f.torch = torch
    tf = {"masked_sum", "masked_mean", "clip_by_value", "entropy_from_logits"}
    exec(cut(wheel_show(root, "verl/utils/torch_functional.py"), tf), verl_f.__dict__)
    ns: dict = {"torch": torch, "verl_F": verl_f, "Optional": Optional, "Any": Any}
    ns |= {"ActorConfig": VerlConfig, "AlgoConfig": type("AlgoConfig", (), {})}
    exec(cut(wheel_show(root, "verl/trainer/ppo/core_algos.py"), names), ns)
    return ns
