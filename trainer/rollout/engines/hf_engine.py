"""transformers' generate as the rollout engine (`hf`). Its key/value caches (hf_cache.py) are imported when an engine
is built: config validation and the start-up checks import this module for the class's properties, and
transformers' generation code is seconds of import that those processes never run."""

from __future__ import annotations

import torch

from ...errors import ConfigError
from .base import (
    EngineContext,
    Rollout,
    RolloutEngine,
    Sampling,
    left_pad,
    response_mask_from,
)
from .recording import TorchRecording


class HFRollout(RolloutEngine):
    """transformers' generate on the actor's module (DDP: the very one, so syncing copies nothing) or,
    under FSDP, on a full copy of it that sync_weights refreshes."""

    name = "hf"
    interruptible = True  # generate_until: the fully async mode's partial rollouts
    generates_with_actor_module = True  # transformers' generate cannot step a sharded module in lockstep

    def __init__(self, ctx: EngineContext):
        from .hf_cache import CACHE_ARG, new_cache, repeatable

        self.cache_arg, self.new_cache, self.repeatable = CACHE_ARG, new_cache, repeatable
        self.model, self.tok, self.cfg, self.max_new = ctx.module, ctx.tokenizer, ctx.cfg, ctx.max_response_length
        self.dtype = ctx.compute_dtype  # mixed precision: the fp32 master weights, matrix products in bf16
        self._landing = None  # where weight transfers land in place (rollout/weight_sync.py Landing)
        rec = ctx.recording
        if rec is not None and rec.windowed:
            raise ConfigError(
                "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start/profile_token_end count an "
                "engine's steps, which vLLM and SGLang take; the hf engine records the whole gen phase: leave them null"
            )
        self._recording = TorchRecording(rec, ctx.device) if rec is not None else None

    def start_profile(self, name: str) -> None:
        """torch.profiler over the worker's process, where transformers generates."""
        self._recording.start(name)

    def stop_profile(self) -> None:
        self._recording.stop()

    @torch.no_grad()
    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        """RolloutEngine.generate with transformers' generate; the engine reports no log-probs."""
        # sync_follows and hold change nothing: the module is the actor's own (or, under FSDP, its copy), never freed
        return self._generate(prompts, n, sampling or Sampling.of(self.cfg), max_new or self.max_new, None)

    @torch.no_grad()
    def generate_until(self, prompts, max_new: int, stopped, sampling: Sampling | None = None):
        """One sample of each prompt, at most max_new tokens, stopping every row at the first token boundary where
        stopped() is true (a partial rollout: the fully async mode's weight sync interrupts it). A row's response
        holds the tokens generated before the stop, or up to its EOS; and whether each row ended by itself (EOS; a
        row cut at max_new the caller tells by its length). `sampling` None: the rollout config's."""
        ro = self._generate(prompts, 1, sampling or Sampling.of(self.cfg), max_new, stopped)
        ends = ro.input_ids[:, ro.prompt_len :] == self.tok.eos_token_id
        return ro, (ends & (ro.response_mask > 0)).any(1).tolist()

    def _generate(self, prompts, n, sampling, max_new, stopped) -> Rollout:
        dev = next(self.model.parameters()).device
        ids, mask = (t.to(dev) for t in left_pad(prompts, self.tok.pad_token_id))
        was_training = self.model.training
        self.model.eval()
        sample = not sampling.greedy
        stopping = None
        if stopped is not None:
            from transformers import StoppingCriteria, StoppingCriteriaList

            class _Interrupted(StoppingCriteria):
                def __call__(self, input_ids, scores, **kwargs):
                    return torch.full((input_ids.shape[0],), stopped(), dtype=torch.bool, device=input_ids.device)

            stopping = StoppingCriteriaList([_Interrupted()])
        with torch.autocast(dev.type, dtype=self.dtype, enabled=self.dtype is not None):
            cache = self.shared_prefill(ids, mask, n) if self.cfg.enable_prefix_caching and n > 1 else None
            if cache is None and self.dtype is not None:
                cache = self.new_cache(self.model.config, self.dtype)  # generate's own would store fp32 keys
            ids, mask = ids.repeat_interleave(n, 0), mask.repeat_interleave(n, 0)
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                **{self.cache_arg: cache},
                max_new_tokens=max_new,
                do_sample=sample,
                temperature=sampling.temperature if sample else None,
                top_p=sampling.top_p if sample else None,
                top_k=max(sampling.top_k, 0) if sample else None,  # transformers: 0 is no top-k
                eos_token_id=self.tok.eos_token_id,
                pad_token_id=self.tok.pad_token_id,
                stopping_criteria=stopping,
            )
        self.model.train(was_training)
        responses = out[:, ids.shape[1] :]
        generated = responses.shape[1]  # every row's tokens so far; an interrupted row has no EOS among them
        if generated < max_new:  # all sequences stopped early (or were interrupted): pad to a fixed width
            pad = torch.full((responses.shape[0], max_new - generated), self.tok.pad_token_id, device=dev)
            responses = torch.cat([responses, pad], 1)
        rmask = response_mask_from(responses, self.tok.eos_token_id)
        rmask = rmask * (torch.arange(max_new, device=dev)[None, :] < generated)
        responses = responses.masked_fill(rmask == 0, self.tok.pad_token_id)
        return Rollout(torch.cat([ids, responses], 1), torch.cat([mask, rmask], 1), rmask, ids.shape[1])

    def shared_prefill(self, ids, mask, n):
        """rollout.enable_prefix_caching: each prompt's keys and values computed once for its n samples
        (what vLLM's prefix cache does for them), then repeated; generate computes only the prompts' last
        token and the responses. The last token is left out so that generate has one to start from.
        Position ids as generate makes them for left padding, so the samples are the ones it would draw.
        None (generate prefills each sample) for one-token prompts and for caches that cannot be repeated
        (linear-attention layers keep a recurrent state instead of keys and values)."""
        if ids.shape[1] < 2:
            return None
        cache = self.new_cache(self.model.config, self.dtype)
        if not self.repeatable(cache):
            return None
        pos = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        self.model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=pos[:, :-1],
            **{self.cache_arg: cache},
            use_cache=True,
            logits_to_keep=1,
        )
        cache.batch_repeat_interleave(n)
        return cache

    def in_place(self, bucket):
        """The module's own parameters, which a transfer can land in (rollout/weight_sync.py Landing)."""
        from ..weight_sync import Landing

        if self._landing is None:
            self._landing = Landing(self.model)
        return self._landing(bucket)

    @torch.no_grad()
    def sync_weights(self, weights):
        """Copies each tensor into the module's own, skipping those that already are the module's (DDP generates
        with the actor's module itself; a transfer may have landed in place)."""
        own = self.model.state_dict()
        for name, t in weights:
            if own[name].data_ptr() != t.data_ptr():  # the same storage when generating with the actor itself
                own[name].copy_(t)
