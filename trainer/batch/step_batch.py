"""One training step's samples on one worker, as one typed batch (OpenRLHF's `Experience`, verl's `DataProto`
with its fields named): every phase of a step takes it and returns it with the fields that phase fills.

Rows are samples: prompt i's n samples sit at rows i*n .. i*n+n-1 as the engine returned them (where a rollout
pool's batch is shared by sample, a worker's first and last prompts may have only some of theirs). Prompts are
left-padded and responses right-padded to one width each, so every [B, R] tensor lines up with the
response columns of `input_ids`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from ..rollout.engines.base import Rollout

# the per-sample fields over the prompt and response columns, by what their padding holds (None: the pad token)
SEQUENCE_FIELDS = {"input_ids": None, "attention_mask": 0, "routed_experts": -1}


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: 1 up to and including EOS
    prompt_len: int  # P: the prompt columns (not a per-sample field)
    group: torch.Tensor  # [B]: the prompt each sample answers; samples of one prompt share it
    engine_logp: torch.Tensor | None = None  # [B, R]: the log-probs the engine reported, when it does
    scores: torch.Tensor | None = None  # [B]: outcome scores
    token_scores: torch.Tensor | None = None  # [B, R]: the score on each response's last token, 0 elsewhere
    baselines: torch.Tensor | None = None  # [B]: the greedy response's score of each sample's prompt (ReMax)
    reward_components: torch.Tensor | None = None  # [B, K]: algorithm.gdpo_reward_keys' values (GDPO)
    old_logp: torch.Tensor | None = None  # [B, R]: the actor's log-probs before the update
    sum_pi_squared: torch.Tensor | None = None  # [B, R]: sum_v pi(v)^2 of the actor before the update (OTB)
    ref_logp: torch.Tensor | None = None  # [B, R]: the reference model's log-probs
    # [B, R]: the distillation teacher's log-probs of the sampled tokens (at temperature 1); in the top-k mode
    # [B, R, K], of its k likeliest tokens at each position, whose ids are teacher_ids [B, R, K]
    teacher_logp: torch.Tensor | None = None
    teacher_ids: torch.Tensor | None = None
    teacher: torch.Tensor | None = None  # [B]: which distillation teacher scores each sample (several teachers)
    values: torch.Tensor | None = None  # [B, R]: the critic's values, masked
    rewards: torch.Tensor | None = None  # [B, R]: token rewards (token_scores, minus the KL penalty when in reward)
    advantages: torch.Tensor | None = None  # [B, R]
    returns: torch.Tensor | None = None  # [B, R]
    is_weights: torch.Tensor | None = None  # [B, R]: rollout correction's importance weights
    # [B, P + R, layers, k] int16: each token's experts, -1 where none (model/moe.py): the engine's
    # (rollout.enable_rollout_routing_replay), or the old-log-prob pass's (actor.router_replay.mode=R2)
    routed_experts: torch.Tensor | None = None

    @classmethod
    def from_rollout(cls, ro: Rollout, n: int, first_sample: int = 0) -> StepBatch:
        """A fresh batch from what an engine sampled, n samples a prompt, its first row the step's sample number
        `first_sample` (a share may start inside a prompt's samples, batch/split_groups.py)."""
        group = (first_sample + torch.arange(len(ro.input_ids), device=ro.input_ids.device)) // n
        b = cls(ro.input_ids, ro.attention_mask, ro.response_mask, ro.prompt_len, group, ro.engine_logp)
        return b.replace(routed_experts=ro.routed_experts)

    @property
    def mask(self) -> torch.Tensor:
        """[B, R] float response mask, the weight of every token in the losses."""
        return self.response_mask.float()

    @staticmethod
    def spans_prompt(name: str) -> bool:
        """Whether a per-sample field spans the prompt columns too ([B, P + R, ...]), not the responses' alone."""
        return name in SEQUENCE_FIELDS

    def __len__(self) -> int:
        return len(self.input_ids)

    def per_sample(self) -> dict[str, torch.Tensor | None]:
        """Every per-sample field by name: the ones that move with their rows."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "prompt_len"}

    def replace(self, **fields) -> StepBatch:
        return dataclasses.replace(self, **fields)

    def take(self, rows) -> StepBatch:
        """The samples at `rows` (a slice, a list or a tensor of indices), every per-sample field with them."""
        return self.replace(**{k: None if v is None else v[rows] for k, v in self.per_sample().items()})

    def to(self, device) -> StepBatch:
        return self.replace(**{k: None if v is None else v.to(device) for k, v in self.per_sample().items()})

    def only(self, *fields: str) -> StepBatch:
        """The same samples with just the named optional fields (the tokens and masks always): the form that
        crosses to another pool's worker on the CPU, carrying no more than that worker reads."""
        kept = {"input_ids", "attention_mask", "response_mask", "group", *fields}
        cut = {k: None for k, v in self.per_sample().items() if k not in kept and v is not None}
        return self.replace(**cut).to("cpu")
