"""A worker of the critic's own pool (critic.enable_resource_pool, OpenRLHF's separate critic nodes): the value
model trained data parallel over the critic workers' own process group, one per training worker, which sends it
its samples for values and, once advantages are known, for the critic's update; that update runs while the
training worker updates the actor."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlrig.trainer.model import lr_schedule, offload
from rlrig.trainer.model import micro_batches as batching
from rlrig.trainer.model.build import build_critic
from rlrig.trainer.model.forward import in_micro_batches
from rlrig.trainer.model.forward import values as critic_values
from rlrig.trainer.rollout.engines import Rollout
from rlrig.trainer.workers import checkpoint_state as worker_state
from rlrig.trainer.workers.ppo_update import mean_stats, update_critic
from rlrig.trainer.workers.training_worker import start_rank


class CriticWorker:
    def __init__(self, cfg_dict: dict, rank: int, world: int, master: tuple[str, int], model_path: str):
        from rlrig.trainer.config.schema import from_dict

        self.cfg = cfg = from_dict(cfg_dict)
        self.rank, self.world = rank, world
        self.device = start_rank(cfg, rank, world, master, [model_path])
        self.budgets = batching.token_budgets(cfg)
        self.critic = build_critic(cfg, model_path, self.device)
        if self.critic.param_offload:
            self.critic.module.to("cpu")

    def _agree_max(self, k: int) -> int:
        t = torch.tensor([k], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _rollout(self, input_ids, attention_mask, response_mask, prompt_len: int) -> Rollout:
        return Rollout(input_ids, attention_mask, response_mask, prompt_len).to(self.device)

    @torch.no_grad()
    def values(self, input_ids, attention_mask, response_mask, prompt_len: int) -> torch.Tensor:
        c, t = self.cfg.critic, self.critic
        ro = self._rollout(input_ids, attention_mask, response_mask, prompt_len)
        parts = batching.rows(
            ro.attention_mask,
            0,
            len(ro.input_ids),
            c.forward_micro_batch_size_per_gpu or c.ppo_micro_batch_size_per_gpu,
            self.budgets["critic.forward_max_token_len_per_gpu"],
            self._agree_max,
        )

        def part(sl):
            with t.precision.autocast():
                return critic_values(
                    t.module, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len, c.model.use_remove_padding
                )

        with offload.module_on(t.module, self.device, t.param_offload):
            return in_micro_batches(parts, part).cpu()

    def update(
        self, input_ids, attention_mask, response_mask, prompt_len: int, values, returns, global_step: int
    ) -> dict:
        """The critic's update at its scheduled learning rate, in the mini and micro batches the training worker's
        own update would use; the stats as the worker reports them."""
        cfg, a, t = self.cfg, self.cfg.actor_rollout_ref, self.critic
        ro = self._rollout(input_ids, attention_mask, response_mask, prompt_len)
        mask = ro.response_mask.float()
        rows, mini = len(mask), a.actor.ppo_mini_batch_size * a.rollout.n // self.world
        micro = min(cfg.critic.ppo_micro_batch_size_per_gpu or mini, mini)
        minis = [
            batching.rows(
                ro.attention_mask,
                s,
                min(s + mini, rows),
                micro,
                self.budgets["critic.ppo_max_token_len_per_gpu"],
                self._agree_max,
            )
            for s in range(0, rows, mini)
        ]
        lr = lr_schedule.lr_at(cfg.critic.optim, global_step - 1, cfg.trainer.total_training_steps)
        lr_schedule.apply(t.opt, lr)
        with offload.module_on(t.module, self.device, t.param_offload):
            stats = update_critic(
                t,
                ro,
                mask,
                values.to(self.device),
                returns.to(self.device),
                cfg,
                minis,
                mini,
                cfg.critic.model.use_remove_padding,
            )
        return {"critic/lr": lr, **mean_stats(stats)}

    # checkpoints: the critic's entries of the training workers' state (worker_state), gathered on rank 0
    def state(self) -> dict | None:
        st = worker_state.critic_state(self.critic)  # a collective: every critic worker joins
        return st if self.rank == 0 else None

    def load(self, state: dict) -> None:
        worker_state.load_critic(self.critic, state)

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
