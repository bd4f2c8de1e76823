"""The PPO update: actor and critic, each over ppo_epochs x mini batches (one optimizer step each) x
micro batches (gradients accumulated), in training mode so gradient checkpointing acts.

Two ways of weighing the micro batches, as verl's two worker implementations (trainer.use_legacy_worker_impl):
its legacy FSDP workers (auto, enable) take each micro batch's own mean loss times its share of the mini batch's
rows; its engine workers (disable) divide each micro batch's summed loss by the whole mini batch's token or
sequence count over every data-parallel rank (core_algos.GlobalBatch), so a token weighs the same whichever micro
batch or rank it falls in."""

from __future__ import annotations

import dataclasses
from contextlib import contextmanager

import numpy as np
import torch

from ..algos import core_algos as algos
from ..algos import policy_losses
from ..algos.bypass_loss import bypass_loss
from ..algos.distillation import DistillationLoss, StudentTopK, distillation_loss
from ..batch.step_batch import StepBatch
from ..model import expert_parallel, offload, parallel
from ..model.build import Trainable
from ..model.forward import ForwardOptions, token_logprobs, token_logprobs_at
from ..model.forward import values as critic_values
from ..model.micro_batches import MiniBatches, size
from ..model.ulysses import SeqParallel
from .profiling import mini_batch_done


@contextmanager
def training(t: Trainable):
    """Training mode for the update only: the rollout and log-prob passes run in eval mode."""
    t.module.train()
    try:
        yield
    finally:
        t.module.eval()
        t.opt.zero_grad(set_to_none=True)  # gradients are not held through the next rollout


# verl's engine reports the losses it normalises over the global batch as sums over the micro batches (its
# AggregationType.SUM): the mini batch's loss; its other metrics stay means
GLOBAL_SUMS = ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "distillation/loss")
# verl reports these as the extremes over the micro batches (its AggregationType.MIN and MAX)
EXTREMES = {
    "distillation/loss_min": min,
    "distillation/loss_max": max,
    **{f"distillation/{s}_mass_{x}": pick for s in ("student", "teacher") for x, pick in (("min", min), ("max", max))},
}


def engine_workers(cfg) -> bool:
    """verl's engine workers' loss normalisation (trainer.use_legacy_worker_impl=disable)."""
    return cfg.trainer.use_legacy_worker_impl == "disable"


def global_batches(
    mask: torch.Tensor, plan: MiniBatches, dp_size: int, batch_sum: algos.AllReduce
) -> list[algos.GlobalBatch]:
    """Each mini batch over every data-parallel rank (verl's engine: the loss mask's tokens all-reduced over the
    data-parallel group, the sequences ppo_mini_batch_size x n), in one all-reduce for all of them."""
    local = torch.stack([sum((mask[sl].sum() for sl in micros), mask.new_zeros(())) for micros in plan.parts])
    tokens = batch_sum(local.double()).tolist()
    return [algos.GlobalBatch(dp_size, n, plan.rows * dp_size) for n in tokens]


def entropy_in_update(a) -> bool:
    """verl 0.9's update computes the entropy only for its loss or when asked (actor.calculate_entropy); otherwise the
    old-log-prob pass reports it."""
    return a.calculate_entropy or a.entropy_coeff != 0


def update_actor(
    t: Trainable,
    batch: StepBatch,
    cfg,
    plan: MiniBatches,
    allreduce: algos.AllReduce,
    forward: ForwardOptions,
    glob: list[algos.GlobalBatch] | None = None,
):
    """Returns the stats (lists per metric) and the log-probs before the first optimizer step: the batch's
    old_logp, or on-policy (old_logp None) those of the update's own first forwards. `allreduce` sums over the
    workers (bypass mode's batch-normalized weights). `forward`: the actor's log-prob pass (ForwardOptions.of), to
    which the update adds the entropy where verl computes it. `glob`: each mini batch's global counts, under verl's
    engine workers' normalisation.

    Nothing in the loop waits for the device: every statistic stays a device tensor until the update ends, then all
    of them come to the host in one copy (a `.item()` per statistic and micro batch stalled the GPU's queue)."""
    a, rc = cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction
    loss_fn = bypass_loss(rc, allreduce) if rc.bypass_mode else policy_losses.get(a.policy_loss.loss_mode).fn
    old_logp, mask, adv, is_w = batch.old_logp, batch.mask, batch.advantages, batch.is_weights
    distill = DistillationLoss.of(cfg)  # distillation.enabled: the teacher's loss joins (algos/distillation.py)
    stats: dict[str, list] = {}
    # one epoch of one mini batch: verl's dp_actor takes the update's own log-probs as the old ones (dp_actor.py:591),
    # in bypass mode too, where they stand in for the engine's (so there the bypass loss's ratio is 1)
    own_old = old_logp is None or (rc.bypass_mode and a.ppo_epochs == 1 and len(plan.parts) == 1)
    # the update's own forwards stand in for the old-log-prob pass, which reports the entropy: computed here then
    with_entropy = entropy_in_update(a) or own_old
    forward = dataclasses.replace(forward, with_entropy=with_entropy, entropy_grad=a.entropy_coeff != 0)
    first = torch.zeros_like(mask) if own_old else None
    with training(t):
        for _ in range(a.ppo_epochs):
            for i, micros in enumerate(plan.parts):
                t.opt.zero_grad()
                agg = algos.Agg(a.loss_agg_mode, glob[i]) if glob else a.loss_agg_mode
                mini: dict[str, list] = {}
                for sl in micros:
                    m = mask[sl]
                    if forward.tap is not None:  # routing replay (actor.router_replay.mode): the rows' routing
                        forward.tap.feed(None if batch.routed_experts is None else batch.routed_experts[sl])
                    with t.precision.autocast():
                        logp, ent, student = student_forward(t.train, batch, sl, forward, distill)
                    if own_old:  # on-policy: one epoch, one mini batch, so these are the old log-probs
                        first[sl] = logp.detach()
                    old = logp.detach() if own_old else old_logp[sl]
                    w = None if is_w is None else is_w[sl]
                    pg, extra = loss_fn(old, logp, adv[sl], m, a, agg, w)
                    loss = pg
                    if with_entropy:
                        entropy = algos.agg_loss(ent, m, agg)
                        loss = loss - a.entropy_coeff * entropy if a.entropy_coeff != 0 else loss
                        mini.setdefault("actor/entropy", []).append(entropy.detach())
                    if a.use_kl_loss:
                        kl = algos.agg_loss(algos.kl_penalty(logp, batch.ref_logp[sl], a.kl_loss_type), m, agg)
                        loss = loss + a.kl_loss_coef * kl
                        mini.setdefault("actor/kl_loss", []).append(kl.detach())
                    if distill is not None:  # verl's distillation_ppo_loss: with the task's loss, or alone
                        teacher = (batch.teacher_logp[sl], None if batch.teacher_ids is None else batch.teacher_ids[sl])
                        dl, dm = distillation_loss(logp, old, teacher, m, distill, agg, w, student)
                        loss = (loss if distill.use_task_rewards else 0.0) + distill.coef * dl
                        for k, v in {**dm, "distillation/loss": dl}.items():
                            mini.setdefault(k, []).append(v.detach())
                    loss = loss + moe_aux_loss(forward, mini, size(sl) / plan.rows if glob else 1.0)
                    (loss if glob else loss * size(sl) / plan.rows).backward()
                    for k, v in (("actor/pg_loss", pg), *extra.items()):
                        mini.setdefault(k, []).append(v.detach() if torch.is_tensor(v) else v)  # bypass: floats too
                for k, vals in mini.items():
                    stats.setdefault(k, []).extend([sum(vals)] if glob and k in GLOBAL_SUMS else vals)
                expert_parallel.finish_grads(t.module)
                stats.setdefault("actor/grad_norm", []).append(parallel.grad_norm_tensor(t.module, a.optim.clip_grad))
                with offload.optimizer_on(t.opt, t.device, t.optimizer_offload):
                    t.opt.step()
                mini_batch_done()  # a scheduled torch profiler steps once per mini batch, as verl's
    host = to_host(stats)
    host.update({k: [pick(host[k])] for k, pick in EXTREMES.items() if k in host})
    return host, (first if own_old else old_logp)


def student_forward(model, batch: StepBatch, sl, forward: ForwardOptions, distill: DistillationLoss | None):
    """(log-probs [B, R], entropy or None, the student's side of the top-k distillation loss or None) of the
    micro batch `sl`: the top-k mode reads the student's log-probs of the teacher's top-k tokens from the same
    forward."""
    ids, attention = batch.input_ids[sl], batch.attention_mask[sl]
    if distill is None or not distill.uses_topk:
        return (*token_logprobs(model, ids, attention, batch.prompt_len, forward), None)
    logp, ent, at, own = token_logprobs_at(model, ids, attention, batch.prompt_len, forward, batch.teacher_ids[sl])
    return logp, ent, StudentTopK(at, own)


def moe_aux_loss(forward: ForwardOptions, mini: dict[str, list], weight: float) -> torch.Tensor | float:
    """The MoE's auxiliary load-balancing loss of the micro batch's forward times the model's router_aux_loss_coef
    (model/moe.py; 0 for a dense model or where the config asks for none), as transformers adds it to its causal LM's
    loss, and reported as actor/moe_aux_loss. `weight`: the micro batch's share of the mini batch's rows where the
    loss is not scaled by it afterwards (verl's engine workers' normalisation), so the mini batch's aux loss is the
    mean of its micro batches' under either normalisation."""
    aux = forward.tap.take_aux() if forward.tap is not None else None
    if aux is None:
        return 0.0
    mini.setdefault("actor/moe_aux_loss", []).append(aux.detach())
    return forward.tap.spec.aux_coef * weight * aux


def to_host(stats: dict[str, list]) -> dict[str, list[float]]:
    """The statistics' device tensors read in one copy (one wait for the device), floats kept as they are."""
    tensors = [v for vals in stats.values() for v in vals if torch.is_tensor(v)]
    read = iter(torch.stack([v.reshape(()).double() for v in tensors]).tolist() if tensors else [])
    return {k: [next(read) if torch.is_tensor(v) else float(v) for v in vals] for k, vals in stats.items()}


def update_critic(t: Trainable, batch: StepBatch, cfg, plan: MiniBatches, sp: SeqParallel | None = None):
    """Under verl's engine workers the value loss of each micro batch is its own token mean, backpropagated
    unscaled: verl's losses.value_loss passes no global batch to agg_loss, and its engine scales no micro batch, so
    the critic's gradient is the sum of its micro batches' (verl b178a3c); kept as verl computes it."""
    c = cfg.critic
    share = (lambda sl: 1.0) if engine_workers(cfg) else (lambda sl: size(sl) / plan.rows)
    mask, packed = batch.mask, c.model.use_remove_padding
    stats: dict[str, list] = {}
    with training(t):
        epochs = c.ppo_epochs if c.ppo_epochs is not None else cfg.actor_rollout_ref.actor.ppo_epochs
        for _ in range(epochs):
            for micros in plan.parts:
                t.opt.zero_grad()
                for sl in micros:
                    with t.precision.autocast():
                        v = critic_values(
                            t.train, batch.input_ids[sl], batch.attention_mask[sl], batch.prompt_len, packed, sp
                        )
                    vf, vclip = algos.value_loss(v, batch.values[sl], batch.returns[sl], mask[sl], c.cliprange_value)
                    (vf * share(sl)).backward()
                    stats.setdefault("critic/vf_loss", []).append(vf.detach())
                    stats.setdefault("critic/vf_clipfrac", []).append(vclip.detach())
                stats.setdefault("critic/grad_norm", []).append(parallel.grad_norm_tensor(t.module, c.optim.clip_grad))
                with offload.optimizer_on(t.opt, t.device, t.optimizer_offload):
                    t.opt.step()
                mini_batch_done()  # a scheduled torch profiler steps once per mini batch, as verl's
    return to_host(stats)


def mean_stats(stats: dict[str, list[float]]) -> dict[str, float]:
    return {k: float(np.mean(v)) for k, v in stats.items()}
