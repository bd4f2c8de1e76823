"""A step's batch as verl names it: what a curriculum sampler (driver/curriculum.py) is handed in verl's
DataProto, from the samples a training worker kept (TrainingWorker.kept_batch)."""

from __future__ import annotations

import torch

from .step_batch import StepBatch

# StepBatch's fields by the names verl's DataProto gives them after a step
VERL_NAMES = {
    "input_ids": "input_ids",
    "attention_mask": "attention_mask",
    "response_mask": "response_mask",
    "group": "group",
    "engine_logp": "rollout_log_probs",
    "token_scores": "token_level_scores",
    "rewards": "token_level_rewards",
    "old_logp": "old_log_probs",
    "ref_logp": "ref_log_prob",
    "teacher_logp": "teacher_logprobs",
    "teacher_ids": "teacher_ids",
    "values": "values",
    "advantages": "advantages",
    "returns": "returns",
}


def verl_fields(b: StepBatch) -> dict[str, torch.Tensor]:
    """The batch's tensors by verl's names, with its prompts and responses as verl splits them."""
    out = {verl: getattr(b, ours) for ours, verl in VERL_NAMES.items() if getattr(b, ours) is not None}
    out["prompts"], out["responses"] = b.input_ids[:, : b.prompt_len], b.input_ids[:, b.prompt_len :]
    return out
