"""A worker of the reference model's own pool (actor_rollout_ref.ref.enable_resource_pool, OpenRLHF's separate
reference nodes): a whole copy of the frozen reference on one device, computing the log-probs of the samples the
training workers send it. Forward passes only, so no process group."""

from __future__ import annotations

import torch

from .. import determinism
from ..batch.step_batch import StepBatch
from ..config.schema import from_dict
from ..model import micro_batches as batching
from ..model import offload
from ..model.build import load_reference
from ..model.forward import ForwardOptions
from . import profiling
from .base import PoolWorker, ensure_local_embedded_model, single_device, whole_model_logprobs


class RefWorker(PoolWorker):
    def __init__(self, cfg_dict: dict, model_path: str, use_gpu: bool, rank: int = 0):
        """rank: this worker's place in the reference's pool (which its profiler's ranks choose among)."""
        cfg = from_dict(cfg_dict)
        a = cfg.actor_rollout_ref
        if determinism.asked(cfg, ("ref",)):
            determinism.enable(cfg.trainer.seed + rank)
        self.device = single_device(use_gpu)
        self.profiler = profiling.worker_profiler(cfg, rank, {"ref": "ref"}, "ref", self.device)
        ensure_local_embedded_model(model_path)
        self.model, self.precision = load_reference(cfg, model_path, self.device, "ddp")  # whole: nothing to shard
        self.offload = a.ref.fsdp_config.param_offload
        if self.offload:
            self.model.to("cpu")
        self.micro = a.ref.log_prob_micro_batch_size_per_gpu
        self.forward = ForwardOptions.of(cfg)  # the whole model here: no sequence-parallel group
        self.budget = batching.token_budgets(cfg)["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"]

    @torch.no_grad()
    def logprobs(self, batch: StepBatch) -> torch.Tensor:
        """[B, R] log-probs of the response tokens, on the CPU for the trip back."""
        with self.profiler.phase("ref"), offload.module_on(self.model, self.device, self.offload):
            return whole_model_logprobs(
                self.model, self.precision, self.forward, self.device, batch, self.micro, self.budget
            )
