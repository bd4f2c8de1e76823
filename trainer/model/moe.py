"""A mixture of experts' routers as the trainer sees them: their logits recorded during a forward (as transformers'
own `output_router_logits` records them, by hooks on the router class the model declares in `_can_record_outputs`),
turned into the model's auxiliary load-balancing loss and into per-layer expert-load statistics, over the real tokens
only (packed rows' tails and left padding excluded, as transformers' load_balancing_loss_func does with an attention
mask); and, for routing replay, each token's top-k experts taken from a recorded tensor instead of the router's own
choice, its gates still the router's probabilities.

Every statistic stays a device tensor until the step reads them all at once (`LoadStats.read`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# the config attributes that give an MoE's expert count, by family (transformers' names)
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")
# the families whose router rlrig can replay: softmax over the experts, the top-k's gates their probabilities, divided
# by their sum where the router normalises them (by the model type: the router's norm_topk_prob, or always)
REPLAYABLE: dict[str, Callable[[torch.nn.Module], bool]] = {
    "qwen2_moe": lambda router: bool(router.norm_topk_prob),
    "qwen3_moe": lambda router: bool(router.norm_topk_prob),
    "mixtral": lambda router: True,
}
# a router's decoder layer, from its module's qualified name (model.layers.3.mlp.gate, under a peft or FSDP wrapper too)
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _pretrained(model: torch.nn.Module):
    """The transformers model inside `model` (a DDP/FSDP wrapper, a peft model), or None."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


@dataclass(frozen=True)
class MoeSpec:
    """An MoE model's routing, read from its config and class: `router` the module class whose output's
    `logits_index`-th element is a layer's router logits [tokens, experts] (the model's
    `_can_record_outputs["router_logits"]`); `num_layers` its decoder layers, dense ones included (engines record
    routed experts for every decoder layer, and routing tensors here are laid out alike); `aux_coef` the auxiliary
    loss's weight where the config asks for the loss (`output_router_logits=True` and `router_aux_loss_coef` not 0;
    else 0); `aux_loss` the model module's own `load_balancing_loss_func(router_logits, num_experts, top_k,
    attention_mask)`."""

    model_type: str
    num_experts: int
    top_k: int
    num_layers: int
    router: type
    logits_index: int
    aux_coef: float
    aux_loss: Callable | None

    @classmethod
    def of(cls, model: torch.nn.Module) -> MoeSpec | None:
        """The spec of `model`'s transformers model, or None for a model whose routers rlrig cannot find (a dense
        model, or an MoE that declares no router_logits recorder)."""
        base = _pretrained(model)
        if base is None:
            return None
        conf = base.config.get_text_config()
        experts = next((getattr(conf, a) for a in _EXPERT_COUNTS if getattr(conf, a, None)), None)
        recorder = (getattr(type(base), "_can_record_outputs", None) or {}).get("router_logits")
        if not experts or getattr(recorder, "target_class", None) is None:
            return None
        coef = float(getattr(conf, "router_aux_loss_coef", 0) or 0) if getattr(conf, "output_router_logits", 0) else 0
        # the model's own module: FSDP2 makes a subclass of the model's class in a module of its own
        found = (getattr(sys.modules.get(c.__module__), "load_balancing_loss_func", None) for c in type(base).__mro__)
        fn = next((f for f in found if f is not None), None)
        return cls(conf.model_type, int(experts), int(conf.num_experts_per_tok), int(conf.num_hidden_layers),
                   recorder.target_class, recorder.index or 0, coef if fn is not None else 0.0, fn)  # fmt: skip

    def routers(self, model: torch.nn.Module) -> dict[int, torch.nn.Module]:
        """The model's routers by their decoder layer, in layer order. A model with dense layers (Qwen's
        mlp_only_layers, decoder_sparse_step) has fewer routers than layers; where a router's name gives no layer,
        they are taken as the model's layers in order, which only a model without dense layers can be."""
        named = [(n, m) for n, m in model.named_modules() if isinstance(m, self.router)]
        found = [_LAYER.search(n) for n, _ in named]
        if all(found):
            return {int(f.group(1)): m for f, (_, m) in zip(found, named)}
        if len(named) != self.num_layers:
            raise ValueError(
                f"{self.model_type}: {len(named)} routers in {self.num_layers} layers, and their module names "
                f"({named[0][0]}) do not say which layers they are in; routing replay cannot place them"
            )
        return {i: m for i, (_, m) in enumerate(named)}

    def replay_refusal(self) -> str | None:
        """Why this family's routing cannot be replayed, or None."""
        if self.model_type in REPLAYABLE:
            return None
        return (
            f"routing replay is built for {', '.join(REPLAYABLE)}, whose routers rlrig can replay, not "
            f"{self.model_type}"
        )


@dataclass(frozen=True)
class Layout:
    """Where a forward's real tokens are: in the model's input ([rows, W], flat `tokens` [T]) and in the batch's
    padded [B, S] layout (`keep`, the same T tokens in the same order). Routing moves between the two: the batch
    holds it as [B, S, layers, k] (the step batch's routed_experts, -1 where none was recorded), a forward's routers
    see it as [rows * W, layers, k]."""

    shape: tuple[int, int]
    tokens: torch.Tensor
    keep: torch.Tensor | None  # None: a sequence-parallel rank's columns, whose routing stays in the forward

    @property
    def real(self) -> torch.Tensor:
        flat = torch.zeros(self.shape[0] * self.shape[1], dtype=torch.bool, device=self.tokens.device)
        return flat.index_fill_(0, self.tokens, True).view(self.shape)

    @classmethod
    def padded(cls, attention_mask: torch.Tensor) -> Layout:
        """The padded forward's: the model reads [B, S - 1] (the last token predicts nothing scored)."""
        inp = attention_mask[:, :-1].bool()
        keep = torch.cat((inp, torch.zeros_like(inp[:, :1])), 1)
        return cls(tuple(inp.shape), inp.flatten().nonzero().squeeze(1), keep)

    @classmethod
    def packed(cls, pk, attention_mask: torch.Tensor) -> Layout:
        """The packed forward's (model/packing.Packed): every real token, in input_ids[attention_mask.bool()] order."""
        return cls(tuple(pk.input_ids.shape), pk.tokens, attention_mask.bool())

    @classmethod
    def columns(cls, real: torch.Tensor) -> Layout:
        """A sequence-parallel rank's share of the packed rows: its columns' real tokens `real` [rows, W / sp]."""
        return cls(tuple(real.shape), real.flatten().nonzero().squeeze(1), None)

    def to_input(self, routing: torch.Tensor) -> torch.Tensor:
        """[B, S, L, k] -> [rows * W, L, k], -1 where the input holds no real token."""
        flat = routing.new_full((self.shape[0] * self.shape[1], *routing.shape[2:]), -1)
        flat[self.tokens] = routing[self.keep.to(routing.device)]
        return flat

    def from_input(self, routing: torch.Tensor) -> torch.Tensor:
        """[rows * W, L, k] -> [B, S, L, k], -1 where the batch holds no token the forward read."""
        out = routing.new_full((*self.keep.shape, *routing.shape[1:]), -1)
        out[self.keep.to(routing.device)] = routing[self.tokens]
        return out


class LoadStats:
    """Expert load over the real tokens of every routed forward, summed as device tensors: the top-k picks per layer
    and expert [L, E], the router entropy per layer [L] and the tokens counted. `read` turns them into verl's
    load-balance metrics (its rollout/moe/* from routed experts: max_vio, min_vio, avg_vio, the token share of the
    most and least loaded expert times the expert count, minus 1) plus the router's mean entropy per layer, under a
    prefix, and starts over. `engine`: counted from an engine's routed experts (add_routed), which carry no router
    probabilities: no entropy, and verl's count of assignments instead."""

    def __init__(self, engine: bool = False):
        self.engine = engine
        self.counts: torch.Tensor | None = None
        self.entropy: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None

    def add_routed(self, routed: torch.Tensor, response_mask: torch.Tensor, num_experts: int, layers: list[int]):
        """An engine's routed experts of the response tokens ([B, R, every decoder layer, k], -1 where none) in the
        MoE `layers`, as verl counts them: each sequence's last response token left out (the engine never read it).
        A dense layer's entries are the engine's filler, never counted."""
        with torch.no_grad():
            mask = response_mask.bool()
            pos = torch.arange(mask.shape[1], device=mask.device)
            last = torch.where(mask, pos, -1).amax(-1, keepdim=True)
            picks = routed[mask & (pos != last)][:, layers].long()  # [tokens, L, k]
            w = (picks >= 0).float()
            counts = torch.stack([
                torch.zeros(num_experts, device=picks.device).scatter_add(0, p.clamp_min(0).flatten(), q.flatten())
                for p, q in zip(picks.unbind(1), w.unbind(1))
            ])  # fmt: skip
            self.counts = counts if self.counts is None else self.counts + counts
            self.entropy = counts.new_zeros(len(counts))
            tokens = w[:, 0, 0].sum()
            self.tokens = tokens if self.tokens is None else self.tokens + tokens

    def add(self, logits: list[torch.Tensor], picks: list[torch.Tensor], real: torch.Tensor, num_experts: int):
        with torch.no_grad():
            w = real.reshape(-1).to(logits[0].device, torch.float32)
            zeros = torch.zeros(num_experts, device=w.device)
            counts = torch.stack([zeros.scatter_add(0, p.reshape(-1), w.repeat_interleave(p.shape[-1])) for p in picks])
            ent = torch.stack([(torch.special.entr(z.float().softmax(-1)).sum(-1) * w).sum() for z in logits])
            self.counts = counts if self.counts is None else self.counts + counts
            self.entropy = ent if self.entropy is None else self.entropy + ent
            self.tokens = w.sum() if self.tokens is None else self.tokens + w.sum()

    def read(self, prefix: str, allreduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> dict[str, float]:
        """The metrics (`allreduce`: the sum over the workers, so each worker reports the whole batch's), {} when
        nothing was counted."""
        if self.counts is None:
            return {}
        flat = torch.cat((self.counts.flatten(), self.entropy, self.tokens[None])).double()
        flat = (allreduce(flat) if allreduce is not None else flat).cpu()
        layers, experts = self.counts.shape
        counts, ent, tokens = flat[: layers * experts].view(layers, experts), flat[-layers - 1 : -1], flat[-1]
        self.counts = self.entropy = self.tokens = None
        share = counts / counts.sum(1, keepdim=True).clamp_min(1.0)
        dev = share * experts - 1.0
        parts = {"max_vio": dev.max(1).values, "min_vio": dev.min(1).values, "avg_vio": dev.abs().mean(1)}
        out = {}
        if self.engine:  # verl's: whether any routing came, and how many top-k assignments
            out[f"{prefix}/routed_experts_found"] = float(counts.sum() > 0)
            out[f"{prefix}/routed_expert_assignments"] = float(counts.sum())
        else:
            parts["router_entropy"] = ent / tokens.clamp_min(1.0)
        for name, per_layer in parts.items():
            out.update({f"{prefix}/{name}/layer_{i}": float(v) for i, v in enumerate(per_layer)})
            out[f"{prefix}/{name}/max"], out[f"{prefix}/{name}/avg"] = float(per_layer.max()), float(per_layer.mean())
        return out


def replayed(out: tuple, routing: torch.Tensor, renorm: bool) -> tuple:
    """A router's (logits, gates, experts) with each token's experts taken from `routing` [tokens, k] where it holds
    one (>= 0; the router's own choice elsewhere), and the gates recomputed as the router computes them, from its own
    probabilities at those experts: softmax over the experts, divided by their sum where the router normalises. The
    gates keep their graph to the router's weight, so its loss still trains it."""
    logits, gates, own = out
    have = routing[:, :1] >= 0
    experts = torch.where(have, routing.to(own.device, own.dtype), own)
    chosen = logits.float().softmax(-1).gather(-1, experts)
    if renorm:
        chosen = chosen / chosen.sum(-1, keepdim=True)
    return (logits, chosen.to(gates.dtype), experts, *out[3:])


class RouterTap:
    """What a forward of an MoE model does with its routers (`around`, one forward at a time): the auxiliary loss of
    that forward (`aux`, with its graph, where the spec has a coefficient and `with_aux`); the expert load into
    `stats` (where given); with `record`, each real token's experts, kept as `recorded` [B, S, layers, k] in the
    batch's layout (-1 where none); and routing replay, each token's experts those of `feed`'s [B, S, layers, k]
    (model/moe.replayed). `layers` counts every decoder layer, as the engines record routed experts: a dense layer's
    are -1 when recorded here and never read. `routers`: the model's routers by decoder layer (MoeSpec.routers),
    hooked only inside `around`, so passes without a tap see the model untouched. Not thread-safe: one forward at a
    time."""

    def __init__(
        self,
        spec: MoeSpec,
        routers: dict[int, torch.nn.Module],
        with_aux: bool,
        stats: LoadStats | None,
        record: bool = False,
        replay: bool = False,
    ):
        self.spec, self.routers, self.with_aux, self.stats = spec, routers, with_aux and spec.aux_coef != 0, stats
        self.record, self.replay = record, replay
        self.renorm = {i: REPLAYABLE[spec.model_type](r) for i, r in routers.items()} if replay else {}
        self.aux: torch.Tensor | None = None
        self._held: list = []  # hooks a replaying forward keeps for its backward pass
        self.recorded: torch.Tensor | None = None  # the last forward's, with `record`
        self.pass_routing: torch.Tensor | None = None  # a whole pass's, in row order (workers/step/sources.py)
        self.routing: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return self.with_aux or self.stats is not None or self.record or (self.replay and self.routing is not None)

    def feed(self, routing: torch.Tensor | None) -> None:
        """The next forward's recorded routing [B, S, layers, k] (its rows), or None: the routers' own. The last
        forward's replay ends here (see `around`)."""
        self.release()
        if routing is not None and self.replay and routing.shape[2] != self.spec.num_layers:
            raise ValueError(
                f"routing replay: the recorded routing has {routing.shape[2]} layers and the model "
                f"{self.spec.num_layers}; the engine must serve the model the actor trains"
            )
        self.routing = routing if self.replay else None

    def release(self) -> None:
        """Unhooks the routers a replaying forward left hooked for its backward pass."""
        for h in self._held:
            h.remove()
        self._held = []

    @contextmanager
    def around(self, layout: Layout):
        """Hooks the routers for one forward whose real tokens `layout` places."""
        logits: dict[int, torch.Tensor] = {}
        picks: dict[int, torch.Tensor] = {}
        routing = None if self.routing is None else layout.to_input(self.routing)

        def hook_of(i: int):
            def hook(_, __, out):
                if routing is not None:
                    out = replayed(out, routing[:, i], self.renorm[i])
                logits[i] = out[self.spec.logits_index] if isinstance(out, tuple) else out
                idx = out[2] if isinstance(out, tuple) and len(out) > 2 and not out[2].is_floating_point() else None
                picks[i] = idx if idx is not None else logits[i].topk(self.spec.top_k, -1).indices
                return out if routing is not None else None

            return hook

        handles = [r.register_forward_hook(hook_of(i)) for i, r in self.routers.items()]
        # gradient checkpointing runs the routers again in the backward pass, which must route as the forward did:
        # a replaying forward with a graph leaves its hooks on until the next feed or release
        hold = routing is not None and torch.is_grad_enabled()
        try:
            yield
        finally:
            for h in handles if not hold else ():
                h.remove()
            self._held = handles if hold else []
            self.routing = None
        layers, chosen = [logits[i] for i in sorted(logits)], [picks[i] for i in sorted(picks)]
        if not layers:
            return
        if self.with_aux:
            s = self.spec
            self.aux = s.aux_loss(tuple(layers), s.num_experts, s.top_k, layout.real.reshape(-1).to(layers[0].device))
        if self.stats is not None:
            self.stats.add(layers, chosen, layout.real, self.spec.num_experts)
        if self.record:
            ids = chosen[0]
            full = torch.full((*ids.shape[:-1], self.spec.num_layers, ids.shape[-1]), -1, dtype=torch.int16,
                              device=ids.device)  # fmt: skip
            full[..., sorted(picks), :] = torch.stack([c.detach().to(torch.int16) for c in chosen], -2)
            self.recorded = layout.from_input(full)

    def take_aux(self) -> torch.Tensor | None:
        """The last forward's auxiliary loss (once)."""
        aux, self.aux = self.aux, None
        return aux


@contextmanager
def tapped(tap: RouterTap | None, layout: Callable[[], Layout]):
    """`tap.around` over the forward inside, `layout` giving where its real tokens are; nothing without a tap."""
    if tap is None or not tap.active:
        yield
        return
    with tap.around(layout()):
        yield
