"""The PPO update: actor and critic, each over ppo_epochs x mini batches (one optimizer step each) x
micro batches (gradients accumulated), in training mode so gradient checkpointing acts."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import torch

from rlrig.trainer.algos import core_algos as algos
from rlrig.trainer.algos import policy_losses
from rlrig.trainer.model import offload, parallel
from rlrig.trainer.model.build import Trainable
from rlrig.trainer.model.forward import token_logprobs
from rlrig.trainer.model.forward import values as critic_values
from rlrig.trainer.model.micro_batches import size


@contextmanager
def training(t: Trainable):
    """Training mode for the update only: the rollout and log-prob passes run in eval mode."""
    t.module.train()
    try:
        yield
    finally:
        t.module.eval()
        t.opt.zero_grad(set_to_none=True)  # gradients are not held through the next rollout


def update_actor(
    t: Trainable, ro, mask, old_logp, ref_logp, adv, cfg, minis: list[list], mini: int, packed: bool, is_weights=None
):
    """`minis`: each mini batch (one optimizer step) as its micro batches (model/micro_batches.py); `mini`: the rows
    of a full mini batch, which scales each micro batch's share of the gradient. Returns the stats (lists
    per metric) and the log-probs before the first optimizer step: old_logp, or on-policy (old_logp None)
    those of the update's own first forwards. `is_weights`: rollout correction's per-token weights, or None."""
    a = cfg.actor_rollout_ref.actor
    loss_fn = policy_losses.get(a.policy_loss.loss_mode).fn
    stats: dict[str, list[float]] = {}
    first = torch.zeros_like(mask) if old_logp is None else None
    with training(t):
        for _ in range(a.ppo_epochs):
            for micros in minis:
                t.opt.zero_grad()
                for sl in micros:
                    m = mask[sl]
                    with t.precision.autocast():
                        logp, ent = token_logprobs(
                            t.train,
                            ro.input_ids[sl],
                            ro.attention_mask[sl],
                            ro.prompt_len,
                            with_entropy=True,
                            entropy_grad=a.entropy_coeff != 0,
                            remove_padding=packed,
                            share_prompts=a.use_prefix_grouper,
                        )
                    if old_logp is None:  # on-policy: one epoch, one mini batch, so these are the old log-probs
                        first[sl] = logp.detach()
                    old = old_logp[sl] if old_logp is not None else logp.detach()
                    pg, extra = loss_fn(
                        old, logp, adv[sl], m, a, a.loss_agg_mode, None if is_weights is None else is_weights[sl]
                    )
                    entropy = algos.agg_loss(ent, m, a.loss_agg_mode)
                    loss = pg - a.entropy_coeff * entropy
                    if a.use_kl_loss:
                        kl = algos.agg_loss(algos.kl_penalty(logp, ref_logp[sl], a.kl_loss_type), m, a.loss_agg_mode)
                        loss = loss + a.kl_loss_coef * kl
                        stats.setdefault("actor/kl_loss", []).append(kl.item())
                    (loss * size(sl) / mini).backward()
                    for k, v in (("actor/pg_loss", pg), ("actor/entropy", entropy), *extra.items()):
                        stats.setdefault(k, []).append(v.item())
                stats.setdefault("actor/grad_norm", []).append(parallel.grad_norm(t.module, a.optim.clip_grad))
                with offload.optimizer_on(t.opt, t.device, t.optimizer_offload):
                    t.opt.step()
    return stats, (old_logp if old_logp is not None else first)


def update_critic(t: Trainable, ro, mask, old_values, returns, cfg, minis: list[list], mini: int, packed: bool):
    c = cfg.critic
    stats: dict[str, list[float]] = {}
    with training(t):
        for _ in range(cfg.actor_rollout_ref.actor.ppo_epochs):
            for micros in minis:
                t.opt.zero_grad()
                for sl in micros:
                    with t.precision.autocast():
                        v = critic_values(t.train, ro.input_ids[sl], ro.attention_mask[sl], ro.prompt_len, packed)
                    vf, vclip = algos.value_loss(v, old_values[sl], returns[sl], mask[sl], c.cliprange_value)
                    (vf * size(sl) / mini).backward()
                    stats.setdefault("critic/vf_loss", []).append(vf.item())
                    stats.setdefault("critic/vf_clipfrac", []).append(vclip.item())
                stats.setdefault("critic/grad_norm", []).append(parallel.grad_norm(t.module, c.optim.clip_grad))
                with offload.optimizer_on(t.opt, t.device, t.optimizer_offload):
                    t.opt.step()
    return stats


def mean_stats(stats: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in stats.items()}
