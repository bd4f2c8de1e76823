"""The forward passes over a rollout: the actor's and reference's log-probs of the response tokens
and the critic's values, each in micro batches, so that no pass holds the whole batch's logits.

Only the response positions' logits are computed (padded: `logits_to_keep`; packed: the language-model head
applied at those positions alone), and log-probs and entropy come from them a chunk of tokens at a time
(model/chunked_logprobs.py): with a 152k vocabulary the logits are the largest tensors of a step. With a fused head
(actor_rollout_ref.model.use_fused_kernels) the logits are not even made: the head computes the log-probs and
entropy of its input itself, a chunk of tokens at a time (model/fused_logprobs.py).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from . import moe, packing, prefix_grouper, ulysses
from .chunked_logprobs import token_logprobs_and_entropy, token_sum_pi_squared
from .fused_logprobs import fused_logprobs_and_entropy
from .topk_logprobs import logprobs_at, teacher_topk


def output_head(model) -> torch.nn.Module:
    """The causal LM's output head (under DDP, the wrapped model's)."""
    return getattr(model, "module", model).get_output_embeddings()


@contextmanager
def head_at(model, at: torch.Tensor):
    """The causal LM's output head applied only at the flat positions `at` of its [rows, W, hidden] input, in
    that order: the packed forward's logits [1, N, V] at the response positions alone, where the whole packed
    rows (prompts, tail padding) would reach the vocabulary otherwise. Whatever the model does after its head
    (logit soft-capping, scaling) acts on each position alone, so it is unchanged."""
    head = output_head(model)
    handle = head.register_forward_pre_hook(lambda _, args: (args[0].flatten(0, 1)[at][None], *args[1:]))
    try:
        yield
    finally:
        handle.remove()


# what transformers' causal LMs do to the head's output before returning it, by the config attribute (or the
# model's own attribute) that turns it on: a fused head, which returns no logits, cannot follow them
HEAD_TRANSFORMS = ("final_logit_softcapping", "logits_scaling", "logit_scale", "output_multiplier", "logit_softcap")


def head_refusal(head: torch.nn.Module) -> str | None:
    """Why the fused head cannot stand in for `head`, or None: it computes log-probs from a plain weight, with no bias
    and no adapter around it (peft's layers are Linear's subclasses, so the class is matched exactly)."""
    if type(head) is not torch.nn.Linear:
        kind = type(head)
        return f"the model's output head is {kind.__module__}.{kind.__qualname__}, not a plain torch.nn.Linear"
    if head.bias is not None:
        return "the model's output head has a bias"
    return None


def fused_head_refusal(model) -> str | None:
    """Why `model` (a causal LM, LoRA applied if any; weightless is enough) cannot have a fused head, in one line, or
    None: its head is not a plain Linear, or its forward transforms what the head returns (HEAD_TRANSFORMS)."""
    conf = model.config.get_text_config()
    for name in HEAD_TRANSFORMS:
        value = getattr(conf, name, None)
        value = getattr(model, name, None) if value is None else value
        if isinstance(value, (int, float)) and value not in (0, 1):
            return f"{conf.model_type}'s {name}={value} transforms the head's logits, which a fused head never makes"
    return head_refusal(model.get_output_embeddings())


@dataclass(frozen=True)
class FusedHead:
    """What the output head computes in place of the logits (actor_rollout_ref.model.use_fused_kernels): the
    log-probs of the known `targets` [...] (one per position its input holds, in order) and their entropy, of its
    input and its own weight (model/fused_logprobs.py), as "logits" [..., 2] ([..., 1] without the entropy), fp32.
    The model is still called through its wrapper (DDP's and FSDP's hooks see the same forward), and only the head's
    forward changes for the call. `take` refuses a model whose forward changed what its head returned (soft-capping,
    scaling), so a transformed head never gives wrong numbers quietly."""

    temperature: float
    with_entropy: bool
    entropy_grad: bool

    @contextmanager
    def on(self, model, targets: torch.Tensor):
        head = output_head(model)
        why = head_refusal(head)
        if why:
            raise ValueError(f"actor_rollout_ref.model.use_fused_kernels=True: {why}; set it False")
        made = []

        def forward(x: torch.Tensor) -> torch.Tensor:
            if x.dim() == targets.dim() + 1 == 3 and x.shape[1] > targets.shape[1]:
                x = x[:, -targets.shape[1] :]  # a model that ignores logits_to_keep: the positions that predict
            logp, ent = fused_logprobs_and_entropy(
                x, head.weight, targets.reshape(x.shape[:-1]), self.temperature, self.with_entropy, self.entropy_grad
            )
            made.append(torch.stack((logp, ent), -1) if ent is not None else logp[..., None])
            return made[-1]

        before = head.__dict__.get("forward")
        head.forward = forward
        try:
            yield lambda out: self.take(out, made)
        finally:
            if before is None:
                del head.forward
            else:
                head.forward = before

    @staticmethod
    def take(out: torch.Tensor, made: list) -> torch.Tensor:
        if len(made) != 1 or out is not made[0]:
            raise ValueError(
                "actor_rollout_ref.model.use_fused_kernels=True: the model's forward changes what its output head "
                "returns (logit soft-capping or scaling), which the fused head cannot compute; set it False"
            )
        return out

    def split(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, None]:
        """(log-probs, entropy or None, no sum_pi_squared) from the head's [..., 2 | 1] output."""
        return out[..., 0], (out[..., 1] if self.with_entropy else None), None


@contextmanager
def _head(fused: FusedHead | None, model, targets: torch.Tensor):
    """`fused` on the model for the call (yielding what reads its output), or the plain head (yielding the identity)."""
    if fused is None:
        yield lambda out: out
    else:
        with fused.on(model, targets) as take:
            yield take


def response_outputs(
    model,
    input_ids,
    attention_mask,
    prompt_len,
    remove_padding=False,
    causal_lm=True,
    fused: FusedHead | None = None,
    tap: moe.RouterTap | None = None,
):
    """The model's outputs where each response token is predicted (the position before it), and those
    tokens: padded ([B, R, ...], [B, R], None), or packed (see model/packing.py) ([N, ...], [N], the [B, R]
    slots they fill). Position ids respect left padding. `fused`: a causal LM's head computes that instead of
    the logits. `tap`: an MoE's routers recorded over the forward's real tokens (model/moe.py)."""
    if remove_padding:
        pk = packing.pack(input_ids, attention_mask, prompt_len)
        targets = pk.input_ids.flatten()[pk.at]
        bounds = packing.attention_kwargs(model, pk.position_ids)
        if not causal_lm:  # a value head: one number a position, cheap everywhere
            out = model(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False, **bounds).logits
            return out.flatten(0, 1)[pk.at - 1], targets, pk.filled
        # the position before a response token is always in the same sequence
        with (
            head_at(model, pk.at - 1),
            _head(fused, model, targets) as take,
            moe.tapped(tap, lambda: moe.Layout.packed(pk, attention_mask)),
        ):
            out = take(model(input_ids=pk.input_ids, position_ids=pk.position_ids, use_cache=False, **bounds).logits)
        return out[0], targets, pk.filled
    resp = input_ids.shape[1] - prompt_len
    pos = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    targets = input_ids[:, prompt_len:]
    # the last token predicts nothing that is scored, so it is left out; a causal LM computes logits only for
    # the response positions: the prompt's are never needed
    keep = {"logits_to_keep": resp} if causal_lm else {}
    with (
        _head(fused if causal_lm else None, model, targets) as take,
        moe.tapped(tap, lambda: moe.Layout.padded(attention_mask)),
    ):
        out = model(
            input_ids=input_ids[:, :-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=pos[:, :-1],
            use_cache=False,
            **keep,
        ).logits
        out = take(out)
    return out[:, -resp:], targets, None


def group_outputs(model, pk: packing.Packed, sp: ulysses.SeqParallel, causal_lm: bool, fused: FusedHead | None = None):
    """Sequence parallel (model/ulysses.py): this rank's outputs at the response positions in its columns, and which
    of the N response tokens those are ([N] bool, in order). `fused`: as in response_outputs."""
    mine, local_at = ulysses.local_positions(pk.at - 1, pk.input_ids.shape[1], sp)
    ids, pos = ulysses.columns(pk.input_ids, sp), ulysses.columns(pk.position_ids, sp)
    with ulysses.attention_over_group(model, sp, pk.position_ids):
        if causal_lm:
            with head_at(model, local_at), _head(fused, model, pk.input_ids.flatten()[pk.at][mine]) as take:
                return take(model(input_ids=ids, position_ids=pos, use_cache=False).logits)[0], mine
        return model(input_ids=ids, position_ids=pos, use_cache=False).logits.flatten(0, 1)[local_at], mine


def from_group(x: torch.Tensor | None, mine: torch.Tensor, filled: torch.Tensor, sp: ulysses.SeqParallel):
    """[B, R] from this rank's share of the N response tokens: the group's sum (every rank gets the whole)."""
    if x is None:
        return None
    return packing.unpack(ulysses.group_sum(x.new_zeros(mine.shape).masked_scatter(mine, x), sp), filled)


@dataclass(frozen=True)
class ForwardOptions:
    """How a log-prob pass reads a model, the same for every micro batch of it: built once per pass (the worker's
    from the config, `ForwardOptions.of`), not spelled out at each call.

    remove_padding: packed rows (model/packing.py). share_prompts: each distinct prompt computed once
    (model/prefix_grouper.py). sp: the sequence-parallel group (needs remove_padding); every rank of it passes the
    same rows and gets the same result. temperature: the rollout's sampling temperature, which divides the logits
    (verl's actor and reference). with_entropy: the entropy too; with entropy_coeff 0 it is only a metric, and
    `entropy_grad=False` keeps it out of the backward pass. with_sum_pi_squared: sum_v pi(v)^2 too (the optimal
    token baseline's). fused_head: the output head computes the log-probs and entropy of its input itself, never
    the logits (FusedHead; actor_rollout_ref.model.use_fused_kernels), which leaves no logits for sum_pi_squared or
    for shared prompts. tap: an MoE's routers recorded in each forward (model/moe.py: the auxiliary loss, the expert
    load), a per-pass object the forwards of one pass share."""

    remove_padding: bool = False
    share_prompts: bool = False
    sp: ulysses.SeqParallel | None = None
    temperature: float = 1.0
    with_entropy: bool = False
    entropy_grad: bool = True
    with_sum_pi_squared: bool = False
    fused_head: bool = False
    tap: moe.RouterTap | None = None

    @classmethod
    def of(cls, cfg, sp: ulysses.SeqParallel | None = None, **more) -> ForwardOptions:
        """The actor's and reference's passes as the config sets them (`more`: what a pass adds)."""
        a = cfg.actor_rollout_ref
        m = a.model
        shared = dict(remove_padding=m.use_remove_padding, share_prompts=a.actor.use_prefix_grouper)
        return cls(**shared, sp=sp, temperature=a.rollout.temperature, fused_head=m.use_fused_kernels, **more)


PLAIN = ForwardOptions()


def token_logprobs(model, input_ids, attention_mask, prompt_len, opts: ForwardOptions = PLAIN):
    """(log-probs [B, R], entropy [B, R] or None) of the response tokens: token_outputs' first two."""
    return token_outputs(model, input_ids, attention_mask, prompt_len, opts)[:2]


def token_outputs(model, input_ids, attention_mask, prompt_len, opts: ForwardOptions = PLAIN):
    """Log-probs [B, R] of the response tokens under the model, the entropy [B, R] (None unless opts.with_entropy)
    and sum_v pi(v)^2 [B, R] (None unless opts.with_sum_pi_squared); `opts`: see ForwardOptions."""
    sp = opts.sp
    t = opts.temperature if opts.temperature > 0 else 1.0  # greedy sampling (0) has no distribution to divide towards
    fused = FusedHead(t, opts.with_entropy, opts.entropy_grad) if opts.fused_head else None
    if fused is not None and (opts.with_sum_pi_squared or opts.share_prompts):
        raise ValueError("a fused head makes no logits: no sum_pi_squared, no shared prompts (use_prefix_grouper)")

    def from_logits(logits, targets):
        if fused is not None:
            return fused.split(logits)
        logp, ent = token_logprobs_and_entropy(logits, targets, opts.with_entropy, opts.entropy_grad, t)
        return logp, ent, token_sum_pi_squared(logits, t) if opts.with_sum_pi_squared else None

    if sp is not None:
        pk = packing.pack(input_ids, attention_mask, prompt_len, multiple=sp.size)
        with moe.tapped(
            opts.tap, lambda: moe.Layout.columns(ulysses.columns(moe.Layout.packed(pk, attention_mask).real, sp))
        ):
            logits, mine = group_outputs(model, pk, sp, causal_lm=True, fused=fused)
        outs = from_logits(logits, pk.input_ids.flatten()[pk.at][mine])
        return tuple(from_group(x, mine, pk.filled, sp) for x in outs)
    if opts.share_prompts:
        if opts.tap is not None and opts.tap.active:
            raise ValueError("an MoE's router statistics are not read with shared prompts (actor.use_prefix_grouper)")
        if opts.with_sum_pi_squared:
            raise ValueError("sum_pi_squared is not computed with shared prompts (actor.use_prefix_grouper)")
        pieces = [
            from_logits(z, y) for z, y in prefix_grouper.response_logits(model, input_ids, attention_mask, prompt_len)
        ]
        logp = torch.cat([p[0] for p in pieces], 1)
        return logp, (torch.cat([p[1] for p in pieces], 1) if opts.with_entropy else None), None
    logits, targets, filled = response_outputs(
        model, input_ids, attention_mask, prompt_len, opts.remove_padding, fused=fused, tap=opts.tap
    )
    outs = from_logits(logits, targets)
    if filled is not None:
        outs = tuple(packing.unpack(x, filled) if x is not None else None for x in outs)
    return outs


def unpack_k(values: torch.Tensor, filled: torch.Tensor) -> torch.Tensor:
    """[N, K] values of the response tokens -> [B, R, K], zero on padding; differentiable."""
    k = values.shape[-1]
    return values.new_zeros((*filled.shape, k)).masked_scatter(filled[..., None].expand(*filled.shape, k), values)


def token_logprobs_at(model, input_ids, attention_mask, prompt_len, opts: ForwardOptions, at: torch.Tensor):
    """(log-probs [B, R] of the response tokens, entropy [B, R] or None, log-probs [B, R, K] of the tokens `at`
    [B, R, K] at each response position, the ids of the model's own k likeliest there [B, R, K]) from one forward:
    the student's side of the top-k distillation loss. Padded or packed rows only: sequence parallelism, shared
    prompts and a fused head, which make no whole logits here, are refused at start-up with that loss."""
    t = opts.temperature if opts.temperature > 0 else 1.0
    logits, targets, filled = response_outputs(
        model, input_ids, attention_mask, prompt_len, opts.remove_padding, tap=opts.tap
    )
    logp, ent = token_logprobs_and_entropy(logits, targets, opts.with_entropy, opts.entropy_grad, t)
    at_logp, own = logprobs_at(logits, at if filled is None else at[filled], t)
    if filled is None:
        return logp, ent, at_logp, own
    ent = packing.unpack(ent, filled) if ent is not None else None
    return packing.unpack(logp, filled), ent, unpack_k(at_logp, filled), unpack_k(own, filled)


@torch.no_grad()
def topk_token_logprobs(model, input_ids, attention_mask, prompt_len, opts: ForwardOptions, k: int):
    """(the k largest log-probs [B, R, K] at each response position, their token ids [B, R, K]), zero on padding:
    the teacher's side of the top-k distillation loss, at temperature 1 (opts.temperature is not read)."""
    logits, _, filled = response_outputs(model, input_ids, attention_mask, prompt_len, opts.remove_padding)
    logp, ids = teacher_topk(logits, k)
    if filled is None:
        keep = attention_mask[:, prompt_len:, None].to(logp.dtype)
        return logp * keep, ids * keep.long()
    return unpack_k(logp, filled), unpack_k(ids, filled)


def values(critic, input_ids, attention_mask, prompt_len, remove_padding=False, sp: ulysses.SeqParallel | None = None):
    """Critic values [B, R]: the value of the state before each response token."""
    if sp is not None:
        pk = packing.pack(input_ids, attention_mask, prompt_len, multiple=sp.size)
        v, mine = group_outputs(critic, pk, sp, causal_lm=False)
        return from_group(v.squeeze(-1).float(), mine, pk.filled, sp)
    v, _, filled = response_outputs(critic, input_ids, attention_mask, prompt_len, remove_padding, causal_lm=False)
    v = v.squeeze(-1).float()
    return packing.unpack(v, filled) if filled is not None else v


def in_micro_batches(parts: list, fn: Callable[[object], torch.Tensor]) -> torch.Tensor:
    """fn over each micro batch (a slice of rows, or a list of row indices: model/micro_batches.py), back in row
    order."""
    outs = [fn(p) for p in parts]
    cat = torch.cat(outs)
    if all(isinstance(p, slice) for p in parts):
        return cat
    order = torch.tensor([i for p in parts for i in p], device=cat.device)
    res = torch.empty_like(cat)
    res[order] = cat
    return res
