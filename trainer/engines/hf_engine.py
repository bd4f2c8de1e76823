"""transformers' generate as the rollout engine (`hf`)."""

from __future__ import annotations

import torch

from .base import EngineContext, Rollout, RolloutEngine, Sampling, left_pad, response_mask_from


class HFRollout(RolloutEngine):
    """transformers' generate on the actor's module (DDP: the very one, so syncing copies nothing) or,
    under FSDP, on a full copy of it that sync_weights refreshes."""

    name = "hf"
    generates_with_actor_module = True  # transformers' generate cannot step a sharded module in lockstep

    def __init__(self, ctx: EngineContext):
        self.model, self.tok, self.cfg, self.max_new = ctx.module, ctx.tokenizer, ctx.cfg, ctx.max_response_length
        self.dtype = ctx.compute_dtype  # mixed precision: the fp32 master weights, matrix products in bf16

    @torch.no_grad()
    def generate(self, prompts, n, sampling=None):
        sampling = sampling or Sampling.of(self.cfg)
        expanded = [p for p in prompts for _ in range(n)]
        dev = next(self.model.parameters()).device
        ids, mask = (t.to(dev) for t in left_pad(expanded, self.tok.pad_token_id))
        was_training = self.model.training
        self.model.eval()
        sample = not sampling.greedy
        with torch.autocast(dev.type, dtype=self.dtype, enabled=self.dtype is not None):
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=self.max_new, do_sample=sample,
                temperature=sampling.temperature if sample else None, top_p=sampling.top_p if sample else None,
                top_k=max(sampling.top_k, 0) if sample else None,  # transformers: 0 is no top-k
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
