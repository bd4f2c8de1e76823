"""A worker of the critic's own pool (critic.enable_resource_pool, OpenRLHF's separate critic nodes): the value
model trained data parallel over the critic workers' own process group, one per training worker, which sends it
its samples for values and, once advantages are known, for the critic's update; that update runs while the
training worker updates the actor."""

from __future__ import annotations

import torch

from ..batch.step_batch import StepBatch
from ..model import offload
from ..model.build import build_critic
from . import checkpoint_state, profiling
from .base import RankWorker


class CriticWorker(RankWorker):
    holds_models = ("critic",)

    def __init__(self, cfg_dict: dict, rank: int, world: int, master: tuple[str, int], model_path: str):
        super().__init__(cfg_dict, rank, world, master, [model_path])
        self.profiler = profiling.worker_profiler(self.cfg, rank, {"critic": "critic"}, "critic", self.device)
        self.critic = build_critic(self.cfg, model_path, self.device)
        if self.critic.param_offload:
            self.critic.module.to("cpu")

    def roles(self) -> tuple[str, ...]:
        return ("critic",)

    @torch.no_grad()
    def values(self, batch: StepBatch) -> torch.Tensor:
        batch = batch.to(self.device)
        with self.profiler.phase("values"):
            with offload.module_on(self.critic.module, self.device, self.critic.param_offload):
                return self._values(self.critic, batch).cpu()

    def update(self, batch: StepBatch, global_step: int) -> dict:
        """The critic's update in the mini and micro batches the training worker's own update would use; the
        stats as the worker reports them."""
        batch = batch.to(self.device)
        with self.profiler.phase("update_critic"):
            with offload.module_on(self.critic.module, self.device, self.critic.param_offload):
                return self._update_critic(self.critic, batch, global_step)

    # checkpoints: the critic's entries of the training workers' state (checkpoint_state), gathered on rank 0
    def state(self) -> dict | None:
        st = checkpoint_state.critic_state(
            self.critic, self.cfg.critic.checkpoint.save_contents
        )  # a collective: every critic worker joins
        return st if self.rank == 0 else None

    def load(self, state: dict) -> None:
        checkpoint_state.load_critic(self.critic, state, self.cfg.critic.checkpoint.loads)
