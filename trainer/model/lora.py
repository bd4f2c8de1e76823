"""LoRA on the actor (actor_rollout_ref.model.lora_rank, lora_alpha, target_modules, exclude_modules,
lora_adapter_path), applied with peft as verl applies it: the actor trains low-rank adapters over frozen
weights, the reference is the same module with its adapters disabled (no second copy of the model), and a
rollout engine receives merged weights, W + scaling * B @ A (per expert for a mixture of experts' fused experts,
which peft adapts as parameters), under the base model's own parameter names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch

from ..errors import ConfigError

ADAPTER = "default"  # peft's name for a model's one adapter
WRAPPED = "base_model.model."  # where a PeftModel keeps the wrapped model's parameter names
# what an adapter's config must match for a checkpoint to resume into it (the shapes and the scaling)
RESUME_FIELDS = ("r", "lora_alpha", "target_modules", "exclude_modules", "use_rslora", "rank_pattern", "alpha_pattern")


def peft_config(model_cfg):
    """The adapter's LoraConfig: read from lora_adapter_path, or built from the keys as verl builds it."""
    from peft import LoraConfig, PeftConfig, TaskType

    if model_cfg.lora_adapter_path:
        try:
            return PeftConfig.from_pretrained(model_cfg.lora_adapter_path)
        except (OSError, ValueError) as e:
            raise ConfigError(
                f"actor_rollout_ref.model.lora_adapter_path={model_cfg.lora_adapter_path}: no peft adapter "
                f"there ({type(e).__name__}); give a directory with adapter_config.json, as peft's "
                "save_pretrained writes it"
            ) from None
    targets = model_cfg.target_modules
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=list(targets) if isinstance(targets, (list, tuple)) else targets,
        exclude_modules=model_cfg.exclude_modules,
        bias="none",
    )


def apply(module: torch.nn.Module, model_cfg) -> torch.nn.Module:
    """`module` wrapped as a PeftModel whose adapters alone train. The model is changed in place (peft swaps
    its target layers), so a copy meant to stay plain must be taken before."""
    from peft import PeftModel, get_peft_model

    if model_cfg.lora_adapter_path:
        return PeftModel.from_pretrained(module, model_cfg.lora_adapter_path, is_trainable=True)
    return get_peft_model(module, peft_config(model_cfg))


def check(model_cfg, model_path: str, load_kwargs: dict) -> dict:
    """Before any worker starts: the adapter fits the model (its target layers exist and are ones rlrig can
    merge), on a weightless copy of the model. Returns what a checkpoint records of the adapter."""
    from peft import PeftType, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = peft_config(model_cfg)
    if cfg.peft_type != PeftType.LORA:
        raise ConfigError(
            f"actor_rollout_ref.model.lora_adapter_path={model_cfg.lora_adapter_path}: a {cfg.peft_type} "
            "adapter; rlrig trains LoRA adapters"
        )
    if getattr(cfg, "use_dora", False):
        raise ConfigError(
            f"actor_rollout_ref.model.lora_adapter_path={model_cfg.lora_adapter_path}: a DoRA adapter; "
            "rlrig merges plain LoRA into the rollout engine's weights"
        )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path, **load_kwargs))
    try:
        peft_model = get_peft_model(model, cfg)
    except ValueError as e:  # peft's own words: no such target module, or one it cannot adapt
        first = str(e).strip().splitlines()[0]
        raise ConfigError(
            f"actor_rollout_ref.model.target_modules={model_cfg.target_modules!r} "
            f"(exclude_modules={model_cfg.exclude_modules!r}): {first}"
        ) from None
    check_mergeable(peft_model, model_cfg)
    return resume_fields(peft_model.peft_config[ADAPTER])


def check_mergeable(peft_model, model_cfg) -> None:
    """Every adapter is one `merged` can fold into its weight: a linear layer's (not fan_in_fan_out), or a parameter's
    (peft's ParamWrapper: a mixture of experts' fused experts and router under all-linear)."""
    from peft.tuners.lora import Linear, LoraLayer, ParamWrapper

    for name, sub in peft_model.named_modules():
        if not isinstance(sub, LoraLayer) or type(sub) is ParamWrapper:
            continue
        if type(sub) is not Linear or sub.fan_in_fan_out:
            raise ConfigError(
                f"actor_rollout_ref.model.target_modules={model_cfg.target_modules!r} adapts "
                f"{name.removeprefix(WRAPPED)} ({type(sub.base_layer).__name__}); rlrig merges adapters of "
                "linear layers only, so name linear layers (all-linear does)"
            )


def resume_fields(config) -> dict:
    """What a checkpoint records of the adapter (RESUME_FIELDS), and the parameters peft adapts where it adapts any
    (all-linear on a mixture of experts): enough to build the same adapter again (model/hf_export.py)."""
    d = config.to_dict()
    out = {k: d.get(k) for k in RESUME_FIELDS}
    if d.get("target_parameters"):
        out["target_parameters"] = d["target_parameters"]
    for k in ("target_modules", "exclude_modules", "target_parameters"):
        if isinstance(out.get(k), (set, list, tuple)):
            out[k] = sorted(out[k])
    return out


def check_resume(saved: dict | None, adapter: dict | None, path) -> None:
    """A checkpoint's weights fit this run's model only with the same adapter shape, or none on both sides."""
    if saved != adapter:
        held = f"LoRA adapters ({_shape(saved)})" if saved else "no LoRA adapters"
        wants = f"trains LoRA adapters ({_shape(adapter)})" if adapter else "trains all weights"
        raise ConfigError(
            f"{path} holds {held}, but this run {wants}; resume with the same actor_rollout_ref.model.lora_* "
            "keys, or start afresh in another trainer.default_local_dir"
        )


def _shape(fields: dict) -> str:
    targets = fields["target_modules"]
    where = f"{len(targets)} layers" if isinstance(targets, list) else f"target_modules={targets}"
    return f"r={fields['r']}, lora_alpha={fields['lora_alpha']}, {where}"


def scalings(peft_model: torch.nn.Module) -> dict[str, float]:
    """Each adapted layer's scaling (lora_alpha / r, or its rsLoRA and per-layer variants), by layer name."""
    from peft.tuners.lora import LoraLayer

    return {name: sub.scaling[ADAPTER] for name, sub in peft_model.named_modules() if isinstance(sub, LoraLayer)}


@dataclass(frozen=True)
class ParameterAdapter:
    """An adapter peft puts on a parameter rather than a layer (its ParamWrapper, what all-linear makes of a mixture of
    experts' fused experts and its router): the adapted tensor's name in the PeftModel's state dict, and the shape of
    its delta, as peft's ParamWrapper.get_delta_weight computes it."""

    weight: str
    experts: int  # peft's num_experts: the parameter's first dimension, 1 for a 2-d parameter
    swapped: bool  # peft's _did_swap_in_out_features: the parameter is [experts, out, in], not [experts, in, out]
    scaling: float

    def merged(self, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """W + delta, in fp32 and stored in W's dtype. With experts E and rank r, A is [E * r, in] and B [out, r * E]:
        delta[e] = scaling * (B[:, :, e] @ A[e]) (B viewed [out, r, E], A [E, r, in]), laid out as the parameter is."""
        a, b = a.float(), b.float()
        if self.experts == 1:
            delta = b @ a
        else:
            a = a.reshape(self.experts, -1, a.shape[-1])
            b = b.reshape(b.shape[0], -1, self.experts)
            delta = torch.einsum("o r e, e r i -> e o i" if self.swapped else "o r e, e r i -> e i o", b, a)
        return (w.float() + self.scaling * delta).to(w.dtype)


def parameter_adapters(peft_model: torch.nn.Module) -> dict[str, ParameterAdapter]:
    """Each ParamWrapper's adapter, by the name of the module holding its lora_A and lora_B."""
    from peft.tuners.lora import ParamWrapper

    names = {id(m): name for name, m in peft_model.named_modules()}
    return {
        name: ParameterAdapter(
            f"{names[id(sub.get_base_layer())]}.{sub.parameter_name}",
            sub.num_experts,
            bool(getattr(sub, "_did_swap_in_out_features", False)),
            sub.scaling[ADAPTER],
        )
        for name, sub in peft_model.named_modules()
        if isinstance(sub, ParamWrapper)
    }


def plain_name(name: str) -> str:
    """A PeftModel's state-dict name as the plain model's: peft's wrapping and every base_layer level gone."""
    return re.sub(r"\.base_layer(?=\.)", "", name.removeprefix(WRAPPED))


def merged(
    scaling: dict[str, float],
    tensors: Iterable[tuple[str, torch.Tensor]],
    params: dict[str, ParameterAdapter] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """The PeftModel's (name, full tensor) stream as the plain model's: an adapted layer's weight is
    W + scaling * B @ A (peft's merge for a linear layer, computed in fp32 and stored in W's dtype), an adapted
    parameter's (`params`, parameter_adapters) as ParameterAdapter.merged; every name loses peft's wrapping. An
    adapter's three tensors arrive together in state-dict order (a module's parameters, then each level of adapters
    on them), so at most one layer is held at a time."""
    roles: dict[str, tuple[str, str]] = {}  # a parameter adapter's tensor -> (its module, W | A | B)
    for module, p in (params or {}).items():
        roles.update({p.weight: (module, "W"), f"{module}.lora_A.{ADAPTER}.weight": (module, "A")})
        roles[f"{module}.lora_B.{ADAPTER}.weight"] = (module, "B")
    held: dict[str, dict[str, torch.Tensor]] = {}
    for name, t in tensors:
        if name in roles:
            module, tag = roles[name]
            parts = held.setdefault(module, {})
            parts[tag] = t
            if len(parts) == 3:
                del held[module]
                p = params[module]
                yield plain_name(p.weight), p.merged(parts["W"], parts["A"], parts["B"])
            continue
        for part, tag in ((".base_layer.", "W"), (".lora_A.", "A"), (".lora_B.", "B")):  # noqa: B007  (read after the break)
            if part in name:
                layer, rest = name.split(part, 1)
                break
        else:
            yield name.removeprefix(WRAPPED), t
            continue
        if tag == "W" and rest != "weight":  # the base layer's bias: unchanged by the adapter
            yield f"{layer}.{rest}".removeprefix(WRAPPED), t
            continue
        parts = held.setdefault(layer, {})
        parts[tag] = t
        if len(parts) == 3:
            del held[layer]
            w, a, b = parts["W"], parts["A"], parts["B"]
            yield (
                f"{layer}.weight".removeprefix(WRAPPED),
                (w.float() + scaling[layer] * (b.float() @ a.float())).to(w.dtype),
            )
    if held:
        raise RuntimeError(f"LoRA layers without all of base weight, lora_A and lora_B: {sorted(held)}")
