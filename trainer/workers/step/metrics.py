"""A step's own metrics, from its batch: scores, lengths, advantages, tokens; verl's rollout-vs-actor check; and
which of them a sequence-parallel group reports once."""

from __future__ import annotations

import torch

from ... import metrics as M
from ...algos import core_algos as algos
from ...batch.step_batch import StepBatch
from ...model.ulysses import SeqParallel


def probs_diff(engine_logp, actor_logp, mask) -> dict:
    """verl's rollout-vs-actor check: |p_engine - p_actor| per response token, after the last sync."""
    diff = (engine_logp.exp() - actor_logp.exp()).abs()[mask > 0]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_std": diff.std(unbiased=False).item(),
    }


def sampled_mask(batch: StepBatch) -> torch.Tensor:
    """[B, R] float mask of the tokens the engine sampled, as verl reads response lengths (the attention mask):
    rejection sampling leaves it whole."""
    return batch.attention_mask[:, batch.prompt_len :].float()


def batch_metrics(batch: StepBatch, written: torch.Tensor, max_response_length: int, device: torch.device) -> dict:
    """The batch's own metrics; `written`: the model's tokens as sampled, whose count weighs this worker's token
    means against the others' (verl takes them over the whole batch's response mask; tool turns are in the
    attention mask and not in it)."""
    mask, lengths = batch.mask, sampled_mask(batch).sum(-1)
    out = {
        "critic/score/mean": batch.scores.mean().item(),
        "critic/score/max": batch.scores.max().item(),
        "critic/score/min": batch.scores.min().item(),
        "critic/rewards/mean": batch.rewards.sum(-1).mean().item(),
        "critic/advantages/mean": algos.masked_mean(batch.advantages, mask).item(),
        "response_length/mean": lengths.mean().item(),
        "response_length/max": lengths.max().item(),
        "response_length/min": lengths.min().item(),
        "response_length/clip_ratio": (lengths >= max_response_length).float().mean().item(),
        "perf/total_num_tokens": float(batch.attention_mask.sum().item()),
        M.TOKENS: float(written.sum().item()),
    }
    if batch.values is not None:
        out["critic/vf_explained_var"] = algos.explained_variance(batch.values, batch.returns, mask)
    if device.type == "cuda":
        out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(device) / 2**30
    return out


def leader_metrics(metrics: dict, sp: SeqParallel | None) -> dict:
    """The ranks of a sequence-parallel group report the same samples: all but the first leave out the metrics the
    driver sums (metrics.py), which would count them once per rank."""
    if sp is None or sp.rank == 0:
        return metrics
    return {k: v for k, v in metrics.items() if k == M.TOKENS or M.rule(k) != M.SUM}
