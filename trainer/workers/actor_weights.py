"""The actor's weights as the rollout engines take them: full tensors by name (FSDP's shards gathered, LoRA's adapters
merged), for this worker's own engine and, over the weight-sync group, for a rollout pool of its own
(hybrid_engine=False), where rank 0 broadcasts and the pool's workers receive (workers/rollout_worker.py)."""

from __future__ import annotations

import torch

from ..model import lora, offload, parallel
from ..model.checkpoint_names import CheckpointLayout
from ..rollout.weight_sync import settle


class ActorWeights:
    """Every training rank holds one; `tensors` and `push` are collectives under FSDP, so every rank calls them.
    `engine_cls`: this worker's own engine, None where the engines are a rollout pool's; where its loader reads
    checkpoints (checkpoint_layout), `tensors` are in the model's checkpoint layout (an MoE's experts one by one). A
    pool is sent them as the actor holds them, and its workers convert what they receive (workers/rollout_worker.py)."""

    def __init__(self, cfg, models, device: torch.device, rank: int, engine_cls=None):
        self.cfg, self.models, self.device, self.rank = cfg, models, device, rank
        own = engine_cls is not None and engine_cls.checkpoint_layout
        self.layout = CheckpointLayout.of(models.actor.module.config) if own else None
        self.sync = None  # the weight-sync group to the rollout pool (rank 0 sends in it)
        self._sent_from = None  # rank 0: the actor as the weight sync lays it out (weight_sync.Landing)

    def tensors(self, dtype: torch.dtype | None = None):
        """The actor's full tensors (merged with LoRA's adapters) in the engine's layout, every rank taking part;
        floating ones cast to `dtype` if given."""
        module = self.models.actor.module
        tensors = parallel.full_tensors(module)
        if self.cfg.actor_rollout_ref.model.uses_lora:
            tensors = lora.merged(lora.scalings(module), tensors, lora.parameter_adapters(module))
        if self.layout is not None:
            tensors = self.layout(tensors)
        for name, t in tensors:
            yield name, t.to(dtype) if dtype is not None and t.is_floating_point() else t

    def join(self, master: tuple[str, int], world: int) -> None:
        """Rank 0 joins the weight-sync group as its rank 0 and tells it the tensors' layout; every rank walks the
        tensors once for it (under FSDP each is a collective)."""
        from ..rollout.weight_sync import Landing, SyncGroup, layout

        actor = self.models.actor
        if self.rank != 0:
            self._gather_for_rank0()
            return
        with offload.module_on(actor.module, self.device, actor.param_offload):
            entries = layout(self.tensors(actor.precision.param_dtype))
        self.sync = SyncGroup(master, 0, world, self.device, self.cfg.actor_rollout_ref.nccl_timeout)
        self.sync.agree_layout(entries)
        self._sent_from = Landing(actor.module)  # the actor's small parameters then live in the packing buffers

    def push(self) -> int:
        """The actor's weights to the rollout pool in the engines' dtype (the one the actor computes in); the bytes
        rank 0 sent (0 elsewhere)."""
        actor = self.models.actor
        if self.sync is None:
            self._gather_for_rank0()
            return 0
        with offload.module_on(actor.module, self.device, actor.param_offload):
            bucket = self.cfg.actor_rollout_ref.rollout.checkpoint_engine.bucket_bytes
            return self.sync.send(self.tensors(actor.precision.param_dtype), bucket, own=self._sent_from)

    def _gather_for_rank0(self) -> None:
        """A rank other than 0 while rank 0 walks the full tensors: under FSDP each is an all-gather every rank joins;
        under DDP rank 0 holds them whole, and nothing here need be read, cast or moved."""
        actor = self.models.actor
        if self.cfg.actor_rollout_ref.actor.strategy != "fsdp":
            return
        with offload.module_on(actor.module, self.device, actor.param_offload):
            for _ in parallel.full_tensors(actor.module):
                pass
        # as rank 0's sync does: its phase ends with its all-gathers done on the host's clock, not merely queued
        settle(self.device)
