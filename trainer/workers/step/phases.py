"""A training worker's step, phase by phase, top to bottom. Each phase takes the step's record (context.Step) and
returns it with its batch's fields filled and its metrics reported; each named block is timed as
timing_s/<phase> (workers/timing.py). What differs between runs (where the reference and the critic are, which
log-probs are the old ones) was chosen when the worker built its StepContext, so no phase asks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...agent.rollout import AgentRollout
from ...algos import core_algos as algos
from ...algos import estimators, rollout_correction
from ...algos.variance_proxy import variance_proxy_metrics
from ...batch.balance import balance
from ...batch.exchange import pf_ppo_resample, sequence_parallel_share
from ...batch.step_batch import StepBatch
from ...reward.components import component_metrics, reward_components
from ...reward.scoring import RewardSource, score_batch, score_batch_with_fields
from ...rollout.engines import GREEDY
from ..base import forked_rngs
from ..teacher import teacher_choice
from .context import Step, StepContext
from .metrics import batch_metrics, leader_metrics, probs_diff
from .sources import old_logprobs


def run(ctx: StepContext, step: Step) -> Step:
    """One PPO step on this worker's share of the step's samples."""
    step = ctx.sources.rollout(ctx, step)  # gen, reward, gen_max; or a rollout pool's samples, scored
    step = balance_batch(ctx, step)
    step = share_sequence_parallel(ctx, step)
    with ctx.trained_on_device():
        step = step.replace(written=step.batch.response_mask)
        with torch.no_grad():
            step = old_log_probs(ctx, step)
            step = reference_log_probs(ctx, step)
            step = teacher_log_probs(ctx, step)
            step = critic_values(ctx, step)
        step = advantages(ctx, step)
        step = pf_ppo(ctx, step)
        with forked_rngs(ctx.device):  # the update's draws (dropout) leave the engine's streams as they were
            step = update(ctx, step)
        step = weight_sync(ctx, step)
        return step_metrics(ctx, step)


# --- the rollout: one of these two, chosen by the worker ---


@dataclass(frozen=True)
class Generate:
    """This worker's engine, through the agent loop: n samples of each prompt with their scores (and ReMax's greedy
    baselines). `rank`: this worker's place, which numbers its samples in the step."""

    agent: AgentRollout
    reward: RewardSource
    rank: int
    greedy_baseline: bool  # the estimator's needs_greedy_baseline (ReMax)

    def __call__(self, ctx: StepContext, step: Step) -> Step:
        return self.sampled(ctx, step)[0]

    def sampled(self, ctx: StepContext, step: Step) -> tuple[Step, list[dict]]:
        """The step with its scored batch, and each sample's reward fields (scoring.score_batch_with_fields)."""
        rows, plan, phases = step.request.rows, step.plan, step.phases
        n = ctx.cfg.actor_rollout_ref.rollout.n
        each, first = step.request.generated(n, self.rank)
        # the engine may drop its weights after its last generation of a step that ends in a weight sync
        syncs = plan.update_actor and not ctx.models.gen_is_actor
        if ctx.device.type == "cuda" and not self.agent.engine.generates_with_actor_module:
            torch.cuda.empty_cache()  # what training freed goes back before the engine's KV cache wakes
        with phases("gen"):
            ro, turns = self.agent.generate(rows, each, sync_follows=syncs and not self.greedy_baseline)
        step = step.report(turns.metrics())
        with phases("reward"):
            batch = StepBatch.from_rollout(ro.to(ctx.device), n, first)
            batch, fields = score_batch_with_fields(ctx.tok, self.reward, rows, batch, each, turns.extra_info())
            batch = with_teacher(ctx, with_components(ctx, batch, fields), rows)
        step = step.report(self.reward.metrics(fields))
        if self.greedy_baseline:  # verl's ReMax: each prompt's greedy response (through the same loop), scored
            with phases("gen_max"):
                greedy, turns = self.agent.generate(rows, 1, GREEDY, sync_follows=syncs)
                greedy = StepBatch.from_rollout(greedy.to(ctx.device), 1)
                baselines = score_batch(ctx.tok, self.reward, rows, greedy, 1, turns.extra_info()).scores
            batch = batch.replace(baselines=baselines.repeat_interleave(each))
        return step.replace(batch=batch), fields


@dataclass(frozen=True)
class PooledSamples:
    """A rollout pool's samples (hybrid_engine=False), which came with the request a row per sample: scored one to
    one."""

    reward: RewardSource

    def __call__(self, ctx: StepContext, step: Step) -> Step:
        req, n = step.request, ctx.cfg.actor_rollout_ref.rollout.n
        with step.phases("reward"):
            ro = with_teacher(ctx, StepBatch.from_rollout(req.samples.to(ctx.device), n, req.first_sample), req.rows)
            if not needs_components(ctx):
                return step.replace(batch=score_batch(ctx.tok, self.reward, req.rows, ro, 1, req.turns))
            batch, fields = score_batch_with_fields(ctx.tok, self.reward, req.rows, ro, 1, req.turns)
            return step.replace(batch=with_components(ctx, batch, fields))


def with_teacher(ctx: StepContext, batch: StepBatch, rows: list[dict]) -> StepBatch:
    """Several distillation teachers: which one scores each sample (StepBatch.teacher), from its prompt row, each row
    holding as many of the batch's samples."""
    choice = teacher_choice(ctx.cfg, rows, len(batch) // max(len(rows), 1))
    return batch if choice is None else batch.replace(teacher=choice.to(batch.input_ids.device))


def needs_components(ctx: StepContext) -> bool:
    return estimators.get(ctx.cfg.algorithm.adv_estimator).needs_reward_components


def with_components(ctx: StepContext, batch: StepBatch, fields: list[dict]) -> StepBatch:
    """GDPO's reward components (algorithm.gdpo_reward_keys) from each sample's reward fields, where the estimator
    reads them."""
    if not needs_components(ctx):
        return batch
    keys = ctx.cfg.algorithm.gdpo_reward_keys
    return batch.replace(reward_components=reward_components(fields, keys, batch.input_ids.device))


# --- moving samples between workers ---


def balance_batch(ctx: StepContext, step: Step) -> Step:
    """trainer.balance_batch: whole prompt groups move, or single samples where groups are split anyway."""
    if not ctx.cfg.trainer.balance_batch:
        return step
    with step.phases("balance"):
        batch, balanced = balance(step.batch, ctx.balanced_group, ctx.pad_id)
    return step.replace(batch=batch).report(balanced)


def share_sequence_parallel(ctx: StepContext, step: Step) -> Step:
    """The sequence-parallel group's ranks then train on the same samples, each on its columns."""
    if ctx.sp is None:
        return step
    with step.phases("sp_share"):
        return step.replace(batch=sequence_parallel_share(step.batch, ctx.sp, ctx.pad_id))


# --- the no-grad passes: old log-probs, the reference's, the teacher's, the critic's values ---


def old_log_probs(ctx: StepContext, step: Step) -> Step:
    """The actor's log-probs before the update, unless the engine's stand for them (verl's bypass mode, its fully
    async trainer) or the update's own first forward will yield them (on-policy)."""
    batch, plan = step.batch, step.plan
    if ctx.old.engine_is_old:
        return step.fill(old_logp=batch.engine_logp)
    with step.phases("old_log_prob"):
        if ctx.old.proximal_at(plan):
            on_policy = ctx.old.on_policy(len(batch), plan)
            return with_entropy(ctx, step, *ctx.sources.proximal(batch, plan.local_step, on_policy))
        if not ctx.old.on_policy(len(batch), plan):
            return with_entropy(ctx, step, *old_logprobs(ctx.sources.actor, batch))
    return step


def with_entropy(ctx: StepContext, step: Step, batch: StepBatch, entropy: torch.Tensor | None) -> Step:
    """verl 0.9 reports actor/entropy from the old-log-prob pass (aggregated by actor.loss_agg_mode)."""
    step = step.replace(batch=batch)
    if entropy is None:
        return step
    agg = ctx.cfg.actor_rollout_ref.actor.loss_agg_mode
    return step.report({"actor/entropy": algos.agg_loss(entropy, batch.mask, agg).item()})


def reference_log_probs(ctx: StepContext, step: Step) -> Step:
    if ctx.sources.ref is None:
        return step
    with step.phases("ref"):
        return step.fill(ref_logp=ctx.sources.ref(step.batch))


def teacher_log_probs(ctx: StepContext, step: Step) -> Step:
    """distillation.enabled: the teacher's log-probs of the sampled tokens (top-k: of its k likeliest, with their
    ids), timed as verl's teacher phase."""
    if ctx.sources.teacher is None:
        return step
    with step.phases("teacher"):
        return step.fill(**ctx.sources.teacher(step.batch))


def critic_values(ctx: StepContext, step: Step) -> Step:
    if ctx.sources.values is None:
        return step
    with step.phases("values"):
        return step.fill(values=ctx.sources.values(step.batch))


# --- advantages ---


def advantages(ctx: StepContext, step: Step) -> Step:
    """Token rewards (minus the KL penalty when it is in the reward), rollout correction, advantages and returns."""
    al, batch, out = ctx.cfg.algorithm, step.batch, {}
    with step.phases("adv"):
        rewards = batch.token_scores
        if al.use_kl_in_reward:
            args = (batch.old_logp, batch.ref_logp, batch.mask, step.plan.kl_coef, al.kl_penalty)
            rewards, out["actor/reward_kl_penalty"] = algos.apply_kl_in_reward(batch.token_scores, *args)
        if not al.rollout_correction.bypass_mode:  # bypass mode corrects in the loss, per micro batch
            batch, corr = correct_rollout(ctx, batch)
            out.update(corr)
        adv_in = estimators.AdvantageInput(
            rewards,
            batch.mask,
            batch.group.tolist(),
            batch.values,
            al.gamma,
            al.lam,
            al.norm_adv_by_std_in_grpo,
            ctx.batch_sum,
            batch.baselines,
            batch.old_logp,
            batch.sum_pi_squared,
            batch.is_weights,
            components=batch.reward_components,
            component_weights=al.gdpo_reward_weights,
        )
        adv, returns = ctx.estimate(adv_in)
        if batch.reward_components is not None:  # verl's GDPO reports its components (a collective: every worker)
            out.update(component_metrics(batch.reward_components, al.gdpo_reward_keys, ctx.batch_sum))
    return step.replace(batch=batch.replace(rewards=rewards, advantages=adv, returns=returns)).report(out)


def correct_rollout(ctx: StepContext, batch: StepBatch) -> tuple[StepBatch, dict]:
    """verl's decoupled rollout correction, once per batch between the old log-probs and the engine's: the
    importance weights (rollout_is), and rejection sampling (rollout_rs), whose rejected tokens leave the response
    mask and with it the advantages and the critic's and actor's losses (not the response lengths)."""
    rc, out = ctx.cfg.algorithm.rollout_correction, {}
    if rc.rollout_is:
        args = (rc.rollout_is, rc.rollout_is_threshold, rc.rollout_is_batch_normalize, ctx.batch_sum)
        is_w, corr = rollout_correction.is_weights(batch.old_logp, batch.engine_logp, batch.mask, *args)
        batch = batch.replace(is_weights=is_w)
        out.update(corr)
    if rc.rollout_rs:
        rs = (rc.rollout_rs, rc.rollout_rs_threshold)
        kept, corr = rollout_correction.rejection_mask(batch.old_logp, batch.engine_logp, batch.response_mask, *rs)
        batch = batch.replace(response_mask=kept)
        out.update(corr)
    return batch, out


def pf_ppo(ctx: StepContext, step: Step) -> Step:
    """algorithm.use_pf_ppo: the samples redrawn over every worker, weighted by their scores."""
    cfg = ctx.cfg
    if not cfg.algorithm.use_pf_ppo:
        return step
    with step.phases("pf_ppo"):
        pf, seed = cfg.algorithm.pf_ppo, cfg.trainer.seed * 1_000_003 + step.plan.global_step
        return step.replace(batch=pf_ppo_resample(step.batch, pf.reweight_method, pf.weight_pow, seed, ctx.pad_id))


# --- the update and the weights it sends ---


def update(ctx: StepContext, step: Step) -> Step:
    """The critic's update, then the actor's (each at its scheduled learning rate); the log-probs before the actor's
    first optimizer step (the batch's old ones where the actor did not update); the samples kept as the update took
    them (verl's batch always holds old_log_probs)."""
    batch, plan, phases, out = step.batch, step.plan, step.phases, {}
    critic_stats = lambda: {}  # noqa: E731
    if ctx.sources.critic_update is not None:  # here it trains now; in its own pool, while the actor updates
        critic_stats = ctx.sources.critic_update.start(batch, plan.global_step, phases)
    actor_logp = None
    if plan.update_actor:
        with phases("update_actor"):
            actor, actor_logp = ctx.sources.actor_update(batch, plan.global_step)
            out.update(actor)
    out.update(critic_stats())
    actor_logp = actor_logp if actor_logp is not None else batch.old_logp
    kept = None
    if step.request.keep:  # the samples as the update takes them, as verl hands its curriculum sampler the batch
        kept = batch if batch.old_logp is not None else batch.replace(old_logp=actor_logp)
    return step.replace(actor_logp=actor_logp, kept=kept).report(out)


def weight_sync(ctx: StepContext, step: Step) -> Step:
    """The next rollout samples from the new policy."""
    if step.plan.update_actor and ctx.sources.sync_engine is not None:
        with step.phases("update_weights"):
            ctx.sources.sync_engine()
    return step


def step_metrics(ctx: StepContext, step: Step) -> Step:
    """verl's rollout-vs-actor check (in its old-log-prob pass, which bypass skips), its variance proxy (after the
    update, for any estimator), the batch's own metrics and the phases' timings."""
    batch, out = step.batch, {}
    if batch.engine_logp is not None and step.actor_logp is not None and not ctx.old.engine_is_old:
        out.update(probs_diff(batch.engine_logp, step.actor_logp, step.written))  # the tokens the engine wrote
    if batch.sum_pi_squared is not None:
        args = (batch.mask, batch.is_weights, step.metrics.get("actor/grad_norm"), ctx.batch_sum)
        out.update(variance_proxy_metrics(batch.advantages, batch.old_logp, batch.sum_pi_squared, *args))
    out.update(batch_metrics(batch, step.written, ctx.cfg.data.max_response_length, ctx.device))
    step = step.report(out)
    return step.replace(metrics=leader_metrics({**step.metrics, **step.phases.metrics()}, ctx.sp))
