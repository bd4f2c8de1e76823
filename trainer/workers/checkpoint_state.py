"""What a worker contributes to a checkpoint: full model and optimizer tensors by name (gathered on
rank 0, a collective every rank joins) and its own random-number streams."""

from __future__ import annotations

import random

import numpy as np
import torch

from ..model import offload, parallel
from ..model.build import Models, Trainable


def _gather(t: Trainable) -> tuple[dict, dict]:
    # gathering is a collective over the training device's backend: an offloaded state comes back for it
    with (
        offload.module_on(t.module, t.device, t.param_offload),
        offload.optimizer_on(t.opt, t.device, t.optimizer_offload),
    ):
        return parallel.gather_state(t.module, t.opt)


def gather(models: Models, rank: int) -> dict | None:
    st = dict(zip(("model", "optim"), _gather(models.actor)))
    if models.critic is not None:
        st.update(critic_state(models.critic))
    return st if rank == 0 else None


def critic_state(t: Trainable) -> dict:
    """The critic's entries of a checkpoint (also what a critic in its own pool contributes)."""
    return dict(zip(("critic", "critic_optim"), _gather(t)))


def _load(t: Trainable, model_sd: dict, optim_sd: dict) -> None:
    with (
        offload.module_on(t.module, t.device, t.param_offload),
        offload.optimizer_on(t.opt, t.device, t.optimizer_offload),
    ):
        parallel.load_state(t.module, t.opt, model_sd, optim_sd)


def load(models: Models, state: dict) -> None:
    _load(models.actor, state["model"], state["optim"])
    if models.critic is not None:
        load_critic(models.critic, state)


def load_critic(t: Trainable, state: dict) -> None:
    if "critic" in state:
        _load(t, state["critic"], state["critic_optim"])


def rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(rng: dict) -> None:
    torch.set_rng_state(rng["torch"]), np.random.set_state(rng["numpy"]), random.setstate(rng["python"])
