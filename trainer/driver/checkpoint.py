"""Checkpoints written atomically: a crash or kill -9 mid-save never damages the latest good one.

Layout under trainer.default_local_dir: global_step_<N>/ (state.pt, trainer.json, and actor/huggingface,
critic/huggingface when save_contents names hf_model) and latest_checkpointed_iteration.txt, which names the
newest complete step. A step directory is written under a temporary name and renamed into place only when
complete; the pointer file is replaced by rename after that.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..errors import ConfigError

POINTER = "latest_checkpointed_iteration.txt"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, write) -> None:
    with open(path, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def save(root: str, step: int, state: dict, rng: list, trainer_state: dict, write_more=None) -> Path:
    """write_more(directory): writes further files into the step's directory before it is renamed into place."""
    root_p = Path(root)
    root_p.mkdir(parents=True, exist_ok=True)
    final = root_p / f"global_step_{step}"
    tmp = root_p / f".global_step_{step}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write(tmp / "state.pt", lambda f: torch.save({"worker": state, "rng": rng}, f))
    _write(tmp / "trainer.json", lambda f: f.write(json.dumps(trainer_state).encode()))
    if write_more is not None:
        write_more(tmp)
    _fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.rename(tmp, final)
    pointer_tmp = root_p / f".{POINTER}.tmp{os.getpid()}"
    _write(pointer_tmp, lambda f: f.write(str(step).encode()))
    os.replace(pointer_tmp, root_p / POINTER)
    _fsync_dir(root_p)
    return final


def latest(root: str) -> Path | None:
    pointer = Path(root) / POINTER
    if not pointer.is_file():
        return None
    path = Path(root) / f"global_step_{pointer.read_text().strip()}"
    return path if (path / "trainer.json").is_file() else None


def _check_complete(path: Path) -> None:
    if not (path / "state.pt").is_file() or not (path / "trainer.json").is_file():
        raise ConfigError(
            f"{path} is not a complete rlrig checkpoint (state.pt and trainer.json); check trainer.resume_from_path"
        )


def trainer_state(path: Path) -> dict:
    """The driver's part alone (step, sampler, what the model was), without reading the tensors."""
    _check_complete(path)
    return json.loads((path / "trainer.json").read_text())


# what a checkpoint written before save_contents was recorded holds of each role
EVERYTHING = ["model", "optimizer", "extra"]


def load_refusal(path: Path, held: dict, wanted: dict) -> str | None:
    """Why a resume cannot load what load_contents asks for: wanted maps a role's config prefix to its load_contents,
    held (trainer.json's "contents") the role's name to what was saved. hf_model is never loaded (nor by verl)."""
    for prefix, contents in wanted.items():
        role = prefix.split(".")[-1]
        has = held.get(role, EVERYTHING)
        missing = [c for c in contents if c != "hf_model" and c not in has]
        if missing:
            return (
                f"{path} holds no {missing[0]} state of the {role} (saved with {', '.join(has) or 'nothing'}), but "
                f"{prefix}.checkpoint.load_contents asks for it; drop it from load_contents or resume from another "
                "checkpoint"
            )
    return None


def load(path: Path) -> tuple[dict, list, dict]:
    _check_complete(path)
    blob = torch.load(path / "state.pt", weights_only=False)
    return blob["worker"], blob["rng"], json.loads((path / "trainer.json").read_text())


def clean_partial(root: str) -> None:
    """Remove temporaries left by a save that was killed."""
    for p in Path(root).glob(".global_step_*.tmp*"):
        shutil.rmtree(p, ignore_errors=True)
