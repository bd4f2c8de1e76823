"""Checkpoints written atomically: a crash or kill -9 mid-save never damages the latest good one.

Layout under trainer.default_local_dir: global_step_<N>/ (state.pt, trainer.json, and actor/huggingface,
critic/huggingface when save_contents names hf_model, sampler.pt for a sampler of the user's own with a state) and
latest_checkpointed_iteration.txt, which names the newest complete step. A step directory is written under a
temporary name and renamed into place only when complete; the pointer file is replaced by rename after that.

`write` gathers a step's payload from the workers and the driver, `restore` hands one back to them.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from ..data.custom_sampler import CustomSampler
from ..errors import ConfigError
from .launch import Workers
from .stages import Prepared

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


def loads(cfg) -> dict:
    """Each checkpointed role's load_contents, by config prefix."""
    wanted = {"actor_rollout_ref.actor": cfg.actor_rollout_ref.actor.checkpoint.loads}
    if cfg.critic_in_use:
        wanted["critic"] = cfg.critic.checkpoint.loads
    return wanted


def write(prep: Prepared, workers: Workers, step: int, data_at: tuple[int, int], extras: dict) -> None:
    """A checkpoint at `step`: the training workers' state (with the critic pool's, if it has one) and every
    worker's random streams, as each role's checkpoint.save_contents asks, and where the data (`data_at`: epoch,
    position) and the KL controller stand (always). `extras`: the mode's own part of trainer.json."""
    import ray

    cfg, w = prep.cfg, workers
    state = ray.get([t.state.remote() for t in w.training])[0]  # under FSDP gathering the state is a collective
    if w.critics:
        state.update(ray.get([c.state.remote() for c in w.critics])[0])
    actor_saves, critic_saves = (
        cfg.actor_rollout_ref.actor.checkpoint.save_contents,
        cfg.critic.checkpoint.save_contents,
    )
    rngs = ray.get([t.rng_state.remote() for t in w.training]) if "extra" in actor_saves else []
    contents = {"actor": list(actor_saves)}
    if cfg.critic_in_use:
        contents["critic"] = list(critic_saves)
    epoch, pos = data_at
    trainer = {
        "global_step": step,
        "epoch": epoch,
        "pos": pos,
        "kl_coef": prep.kl_ctrl.value,
        "model_path": prep.model_path,
        "gguf_file": cfg.actor_rollout_ref.model.gguf_file,
        "lora": prep.adapter,
        "contents": contents,
        **extras,
    }
    writes = [job for job in (hf_models(prep, state, contents), sampler_writer(prep.sampler)) if job is not None]
    for role, key in (("actor", "model"), ("critic", "critic")):  # weights gathered for hf_model alone
        if "model" not in contents.get(role, []):
            state.pop(key, None)
    more = (lambda d: [write(d) for write in writes]) if writes else None
    save(str(prep.out), step, state, rngs, trainer, more)


def sampler_writer(sampler):
    """What writes a sampler of the user's own's state (its state_dict) into a step's directory; None: it has none."""
    state = sampler.state() if isinstance(sampler, CustomSampler) else None
    return None if state is None else (lambda d: CustomSampler.save(state, d))


def hf_models(prep: Prepared, state: dict, contents: dict):
    """What writes <role>/huggingface into a step's directory for each role whose save_contents names hf_model."""
    from ..model.hf_export import write_hf_model

    a, c = prep.cfg.actor_rollout_ref.model, prep.cfg.critic.model
    jobs = []
    if "hf_model" in contents["actor"]:
        jobs.append(
            lambda d: write_hf_model(
                state["model"], prep.model_path, d / "actor" / "huggingface", a.gguf_file, prep.adapter
            )
        )
    if "hf_model" in contents.get("critic", []):
        base, gguf = (c.path, c.gguf_file) if c.path else (prep.model_path, a.gguf_file)
        jobs.append(
            lambda d: write_hf_model(state["critic"], base, d / "critic" / "huggingface", gguf, value_head=True)
        )
    return (lambda d: [job(d) for job in jobs]) if jobs else None


def restore(prep: Prepared, workers: Workers) -> dict:
    """The checkpoint at prep.resume_from into the workers (each role's load_contents) and the sampler; its
    trainer.json, for the rest of the driver (the step, the KL coefficient, the mode's own part)."""
    import ray

    state, rngs, trainer = load(prep.resume_from)
    if "extra" not in prep.cfg.actor_rollout_ref.actor.checkpoint.loads:
        rngs = []  # the workers keep the random streams they started with
    ray.get(
        [t.load.remote(state, rngs[i] if i < len(rngs) else None) for i, t in enumerate(workers.training)]
        + [c.load.remote(state) for c in workers.critics]
    )
    prep.sampler.epoch, prep.sampler.pos = trainer["epoch"], trainer["pos"]
    if isinstance(prep.sampler, CustomSampler):
        prep.sampler.restore(prep.resume_from)
    return trainer
