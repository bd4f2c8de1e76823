"""The generation copy under FSDP (model/build.py): in the compute dtype, never a second fp32 copy of the actor."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlrig.trainer.config.schema import FsdpConfig, MixedPrecisionConfig
from rlrig.trainer.model.build import generation_copy
from rlrig.trainer.model.precision import resolve


class Allocations(TorchDispatchMode):
    """Bytes of every tensor the ops inside create, by dtype."""

    def __init__(self):
        super().__init__()
        self.bytes: dict[torch.dtype, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.bytes[t.dtype] = self.bytes.get(t.dtype, 0) + t.numel() * t.element_size()
        return out


def test_the_generation_copy_is_allocated_in_the_compute_dtype_only():
    module = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    module.register_buffer("inv_freq", torch.arange(8, dtype=torch.float32))
    fsdp = FsdpConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16"))
    prec = resolve(fsdp, "cuda", "fsdp", "actor")
    assert prec.mixed and prec.param_dtype == torch.bfloat16
    fp32_params = sum(p.numel() * 4 for p in module.parameters())
    with Allocations() as alloc:
        gen = generation_copy(module, prec)
    # one compute-dtype copy of the parameters; in fp32 only the buffers (not a copy of the actor)
    assert alloc.bytes.get(torch.bfloat16, 0) == fp32_params // 2
    assert alloc.bytes.get(torch.float32, 0) < fp32_params // 100
    assert all(p.dtype == torch.bfloat16 for p in gen.parameters())
    assert gen.inv_freq.dtype == torch.float32 and torch.equal(gen.inv_freq, module.inv_freq)
    own = {p.data_ptr() for p in module.parameters()}
    assert not any(p.data_ptr() in own for p in gen.parameters())


def test_model_dtype_is_the_dtype_the_weights_load_in():
    """fsdp_config.model_dtype (verl's fsdp_workers.py: from_pretrained(torch_dtype=...)): the loaded parameters'
    dtype for the actor and the reference; unset, fp32 on CPU."""
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model.build import load_reference

    path = ensure_tiny_model()
    cfg = parse_overrides(["trainer.device=cpu", "actor_rollout_ref.ref.fsdp_config.model_dtype=bf16"])
    ref, _ = load_reference(cfg, path, torch.device("cpu"), "ddp")
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    ref, _ = load_reference(parse_overrides(["trainer.device=cpu"]), path, torch.device("cpu"), "ddp")
    assert {p.dtype for p in ref.parameters()} == {torch.float32}


def test_model_torch_dtype_loads_the_actor_and_reference_in_it():
    """actor_rollout_ref.model.torch_dtype (verl's cispo example): both models built from actor_rollout_ref.model
    load in that dtype; set beside a different fsdp_config.model_dtype it is refused."""
    import pytest

    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.errors import ConfigError
    from rlrig.trainer.model.build import load_reference
    from rlrig.trainer.model.precision import resolve

    path = ensure_tiny_model()
    cfg = parse_overrides(["trainer.device=cpu", "actor_rollout_ref.model.torch_dtype=bfloat16"])
    ref, _ = load_reference(cfg, path, torch.device("cpu"), "ddp")
    assert {p.dtype for p in ref.parameters()} == {torch.bfloat16}
    assert resolve(cfg.actor_rollout_ref.actor.fsdp_config, "cpu", "ddp", "actor").model_dtype == torch.bfloat16
    with pytest.raises(ConfigError, match="keep one"):
        parse_overrides(
            ["actor_rollout_ref.model.torch_dtype=bf16", "actor_rollout_ref.ref.fsdp_config.model_dtype=fp32"]
        )
    with pytest.raises(ConfigError, match="torch_dtype='fp16': choose one of"):
        parse_overrides(["actor_rollout_ref.model.torch_dtype=fp16"])
