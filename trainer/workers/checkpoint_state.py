"""What a worker contributes to a checkpoint: full model and optimizer tensors by name (gathered on
rank 0, a collective every rank joins) and its own random-number streams. What is gathered and what is loaded
follow the role's checkpoint.save_contents and load_contents (verl's model, optimizer, extra, hf_model)."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..model import offload, parallel
from ..model.build import Models, Trainable


def _gather(t: Trainable, contents: list) -> tuple[dict | None, dict | None]:
    # the weights also when only hf_model is asked for: the driver writes that directory from them
    model, optim = "model" in contents or "hf_model" in contents, "optimizer" in contents
    # gathering is a collective over the training device's backend: an offloaded state comes back for it
    with (
        offload.module_on(t.module, t.device, t.param_offload),
        offload.optimizer_on(t.opt, t.device, t.optimizer_offload and optim),
    ):
        return parallel.gather_state(t.module, t.opt, model, optim)


def _entries(names: tuple[str, str], parts: tuple) -> dict:
    return {name: part for name, part in zip(names, parts) if part is not None}


def gather(models: Models, rank: int, actor_contents: list, critic_contents: list) -> dict | None:
    st = _entries(("model", "optim"), _gather(models.actor, actor_contents))
    if models.critic is not None:
        st.update(critic_state(models.critic, critic_contents))
    return st if rank == 0 else None


def critic_state(t: Trainable, contents: list) -> dict:
    """The critic's entries of a checkpoint (also what a critic in its own pool contributes)."""
    return _entries(("critic", "critic_optim"), _gather(t, contents))


def _load(t: Trainable, model_sd: dict | None, optim_sd: dict | None) -> None:
    with (
        offload.module_on(t.module, t.device, t.param_offload),
        offload.optimizer_on(t.opt, t.device, t.optimizer_offload),
    ):
        parallel.load_state(t.module, t.opt, model_sd, optim_sd)


def load(models: Models, state: dict, actor_contents: list, critic_contents: list) -> None:
    """The parts load_contents names (the driver has checked that the checkpoint holds them)."""
    _load(models.actor, *_parts(state, ("model", "optim"), actor_contents))
    if models.critic is not None:
        load_critic(models.critic, state, critic_contents)


def load_critic(t: Trainable, state: dict, contents: list) -> None:
    _load(t, *_parts(state, ("critic", "critic_optim"), contents))


def _parts(state: dict, names: tuple[str, str], contents: list) -> tuple[dict | None, dict | None]:
    model, optim = names
    return (
        state.get(model) if "model" in contents else None,
        state.get(optim) if "optimizer" in contents else None,
    )


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["torch"]), np.random.set_state(rng["numpy"]), random.setstate(rng["python"])
