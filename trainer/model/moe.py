"""A mixture of experts' routers as the trainer sees them: their logits recorded during a forward (as transformers'
own `output_router_logits` records them, by hooks on the router class the model declares in `_can_record_outputs`),
turned into the model's auxiliary load-balancing loss and into per-layer expert-load statistics, over the real tokens
only (packed rows' tails and left padding excluded, as transformers' load_balancing_loss_func does with an attention
mask); and, for routing replay, each token's top-k experts taken from a recorded tensor instead of the router's own
choice, its gates still the router's probabilities.

Every statistic stays a device tensor until the step reads them all at once (`LoadStats.read`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch

# the config attributes that give an MoE's expert count, by family (transformers' names)
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "n_routed_experts")


def _pretrained(model: torch.nn.Module):
    """The transformers model inside `model` (a DDP/FSDP wrapper, a peft model), or None."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


@dataclass(frozen=True)
class MoeSpec:
    """An MoE model's routing, read from its config and class: `router` the module class whose output's
    `logits_index`-th element is a layer's router logits [tokens, experts] (the model's
    `_can_record_outputs["router_logits"]`); `aux_coef` the auxiliary loss's weight where the config asks for the loss
    (`output_router_logits=True` and `router_aux_loss_coef` not 0; else 0); `aux_loss` the model module's own
    `load_balancing_loss_func(router_logits, num_experts, top_k, attention_mask)`."""

    model_type: str
    num_experts: int
    top_k: int
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
        fn = getattr(sys.modules[type(base).__module__], "load_balancing_loss_func", None)
        return cls(conf.model_type, int(experts), int(conf.num_experts_per_tok), recorder.target_class,
                   recorder.index or 0, coef if fn is not None else 0.0, fn)  # fmt: skip

    def routers(self, model: torch.nn.Module) -> list[torch.nn.Module]:
        """The model's routers, one a layer, in layer order."""
        return [m for m in model.modules() if isinstance(m, self.router)]


class LoadStats:
    """Expert load over the real tokens of every routed forward, summed as device tensors: the top-k picks per layer
    and expert [L, E], the router entropy per layer [L] and the tokens counted. `read` turns them into verl's
    load-balance metrics (its rollout/moe/* from routed experts: max_vio, min_vio, avg_vio, the token share of the
    most and least loaded expert times the expert count, minus 1) plus the router's mean entropy per layer, under a
    prefix, and starts over."""

    def __init__(self):
        self.counts: torch.Tensor | None = None
        self.entropy: torch.Tensor | None = None
        self.tokens: torch.Tensor | None = None

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
        parts["router_entropy"] = ent / tokens.clamp_min(1.0)
        out = {}
        for name, per_layer in parts.items():
            out.update({f"{prefix}/{name}/layer_{i}": float(v) for i, v in enumerate(per_layer)})
            out[f"{prefix}/{name}/max"], out[f"{prefix}/{name}/avg"] = float(per_layer.max()), float(per_layer.mean())
        return out


class RouterTap:
    """What a forward of an MoE model collects from its routers (`around`, one forward at a time): the auxiliary
    loss of that forward (`aux`, with its graph, where the spec has a coefficient and `with_aux`), and the expert
    load into `stats` (where `stats` is given). `routers`: the model's routers (MoeSpec.routers), hooked only inside
    `around`, so passes without a tap see the model untouched."""

    def __init__(self, spec: MoeSpec, routers: list[torch.nn.Module], with_aux: bool, stats: LoadStats | None):
        self.spec, self.routers, self.with_aux, self.stats = spec, routers, with_aux and spec.aux_coef != 0, stats
        self.aux: torch.Tensor | None = None

    @property
    def active(self) -> bool:
        return self.with_aux or self.stats is not None

    @contextmanager
    def around(self, real: torch.Tensor):
        """Hooks the routers for one forward of a [rows, W] input whose real tokens `real` [rows, W] marks."""
        logits: dict[int, torch.Tensor] = {}
        picks: dict[int, torch.Tensor] = {}

        def record(i: int):
            def hook(_, __, out):
                logits[i] = out[self.spec.logits_index] if isinstance(out, tuple) else out
                idx = out[-1] if isinstance(out, tuple) and not out[-1].is_floating_point() else None
                picks[i] = idx if idx is not None else logits[i].topk(self.spec.top_k, -1).indices

            return hook

        handles = [r.register_forward_hook(record(i)) for i, r in enumerate(self.routers)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        layers = [logits[i] for i in sorted(logits)]
        if not layers:
            return
        if self.with_aux:
            s = self.spec
            self.aux = s.aux_loss(tuple(layers), s.num_experts, s.top_k, real.reshape(-1).to(layers[0].device))
        if self.stats is not None:
            self.stats.add(layers, [picks[i] for i in sorted(picks)], real, self.spec.num_experts)

    def take_aux(self) -> torch.Tensor | None:
        """The last forward's auxiliary loss (once)."""
        aux, self.aux = self.aux, None
        return aux


@contextmanager
def tapped(tap: RouterTap | None, real: Callable[[], torch.Tensor]):
    """`tap.around` over the forward inside, `real` giving its input's real-token mask; nothing without a tap."""
    if tap is None or not tap.active:
        yield
        return
    with tap.around(real()):
        yield
