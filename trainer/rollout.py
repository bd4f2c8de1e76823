"""Rollout engines behind one interface, chosen by actor_rollout_ref.rollout.name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    """A batch of sampled sequences: left-padded prompts followed by right-padded responses."""

    input_ids: torch.Tensor  # [B, P + R]
    attention_mask: torch.Tensor  # [B, P + R]
    response_mask: torch.Tensor  # [B, R]: 1 up to and including EOS
    prompt_len: int
    engine_logp: torch.Tensor | None = None  # [B, R] log-probs the engine reported, when it does

    def to(self, device) -> "Rollout":
        logp = self.engine_logp.to(device) if self.engine_logp is not None else None
        return Rollout(self.input_ids.to(device), self.attention_mask.to(device), self.response_mask.to(device),
                       self.prompt_len, logp)


class RolloutEngine:
    """What a rollout backend implements. `sync_weights` is called after every optimizer step and
    after a checkpoint is loaded with the actor's (name, full tensor) pairs; it must hand the engine
    the weights in memory, never via disk, and consume the whole iterator (under FSDP each item is
    a collective all ranks take part in)."""

    name = "?"

    def generate(self, prompts: list[list[int]], n: int, greedy: bool = False) -> Rollout:
        raise NotImplementedError

    def sync_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """For the log line naming the engine."""
        return self.name


def response_mask_from(responses: torch.Tensor, eos_id: int) -> torch.Tensor:
    # 1 on every token up to and including the first EOS
    is_eos = (responses == eos_id).int()
    after_eos = (is_eos.cumsum(-1) - is_eos) > 0
    return (~after_eos).long()


def pack_responses(prompts: list[list[int]], n: int, responses: list[list[int]], logprobs: list[list[float]] | None,
                   max_new: int, pad_id: int, eos_id: int) -> Rollout:
    """An engine's token lists (prompt i's samples at rows i*n .. i*n+n-1) as a padded Rollout."""
    expanded = [p for p in prompts for _ in range(n)]
    if len(responses) != len(expanded):
        raise ValueError(f"engine returned {len(responses)} sequences for {len(expanded)} requested")
    ids, mask = left_pad(expanded, pad_id)
    resp = torch.full((len(responses), max_new), pad_id, dtype=torch.long)
    logp = torch.zeros((len(responses), max_new)) if logprobs is not None else None
    for i, r in enumerate(responses):
        r = r[:max_new]
        resp[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        if logp is not None:
            logp[i, :len(r)] = torch.tensor(logprobs[i][:len(r)])
    rmask = response_mask_from(resp, eos_id)
    lengths = torch.tensor([len(r) for r in responses]).clamp_max(max_new)
    rmask = rmask * (torch.arange(max_new)[None, :] < lengths[:, None])  # padding after a length stop is not a response
    resp = resp.masked_fill(rmask == 0, pad_id)
    if logp is not None:
        logp = logp * rmask
    return Rollout(torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), rmask, ids.shape[1], logp)


def left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids, mask


class HFRollout(RolloutEngine):
    """transformers' generate on the actor's module (DDP: the very one, so syncing copies nothing) or,
    under FSDP, on a full copy of it that sync_weights refreshes."""

    name = "hf"

    def __init__(self, model, tokenizer, cfg, max_response_length: int):
        self.model, self.tok, self.cfg, self.max_new = model, tokenizer, cfg, max_response_length

    @torch.no_grad()
    def generate(self, prompts, n, greedy=False):
        expanded = [p for p in prompts for _ in range(n)]
        dev = next(self.model.parameters()).device
        ids, mask = (t.to(dev) for t in left_pad(expanded, self.tok.pad_token_id))
        was_training = self.model.training
        self.model.eval()
        sample = self.cfg.do_sample and not greedy
        out = self.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new, do_sample=sample,
            temperature=self.cfg.temperature if sample else None, top_p=self.cfg.top_p if sample else None,
            top_k=0 if sample else None,
            eos_token_id=self.tok.eos_token_id, pad_token_id=self.tok.pad_token_id,
        )
        self.model.train(was_training)
        responses = out[:, ids.shape[1]:]
        if responses.shape[1] < self.max_new:  # all sequences stopped early: pad to a fixed width
            pad = torch.full((responses.shape[0], self.max_new - responses.shape[1]), self.tok.pad_token_id, device=dev)
            responses = torch.cat([responses, pad], 1)
        rmask = response_mask_from(responses, self.tok.eos_token_id)
        responses = responses.masked_fill(rmask == 0, self.tok.pad_token_id)
        return Rollout(torch.cat([ids, responses], 1), torch.cat([mask, rmask], 1), rmask, ids.shape[1])

    @torch.no_grad()
    def sync_weights(self, weights):
        own = self.model.state_dict()
        for name, t in weights:
            if own[name].data_ptr() != t.data_ptr():  # the same storage when generating with the actor itself
                own[name].copy_(t)


class EngineUnavailable(RuntimeError):
    """The engine's package is missing or cannot run here; the message says how to fix it."""


def make_engine(name: str, model, tokenizer, cfg, max_response_length: int, *, model_path: str = "",
                max_prompt_length: int = 0, device: str = "cpu", seed: int = 0) -> RolloutEngine:
    if name == "hf":
        return HFRollout(model, tokenizer, cfg, max_response_length)
    common = dict(model_path=model_path, tokenizer=tokenizer, cfg=cfg, max_response_length=max_response_length,
                  max_prompt_length=max_prompt_length, device=device, seed=seed)
    if name == "vllm":
        from .vllm_rollout import VLLMRollout

        return VLLMRollout(**common)
    if name == "sglang":
        from .sglang_rollout import SGLangRollout

        return SGLangRollout(**common)
    if name == "auto":
        # the embedded default: vLLM where it is installed and starts, else transformers
        try:
            from .vllm_rollout import VLLMRollout

            return VLLMRollout(**common)
        except EngineUnavailable as e:
            print(f"rlrig: rollout engine auto -> hf ({e})", flush=True)
            return HFRollout(model, tokenizer, cfg, max_response_length)
    raise ValueError(f"actor_rollout_ref.rollout.name={name}: use hf, vllm, sglang or auto")
