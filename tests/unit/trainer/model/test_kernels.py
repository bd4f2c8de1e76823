"""Liger's kernels (model.use_liger, model/kernels.py): verl's call on the loaded actor, reference and critic, and
the one-line refusals of a run that cannot have them (the CPU, the extra not installed, a model type Liger does
not patch)."""

import sys
import types

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model import kernels
from tests.helpers.gpu_config import GPU_MICRO

KEY = "actor_rollout_ref.model.use_liger"


@pytest.mark.parametrize(
    "overrides, key",
    [
        ([f"{KEY}=True"], KEY),
        (["critic.model.use_liger=True", "algorithm.adv_estimator=gae"], "critic.model.use_liger"),
    ],
)
def test_a_cpu_run_with_liger_is_refused_in_one_line(overrides, key):
    with pytest.raises(ConfigError) as e:
        parse_overrides(["trainer.device=cpu", *overrides])
    text = str(e.value)
    assert text.startswith(f"{key}=True: ") and f"set {key}=False or run on a GPU" in text and "\n" not in text


def test_the_critic_key_waits_for_a_critic():
    parse_overrides(["trainer.device=cpu", "critic.model.use_liger=True", "algorithm.adv_estimator=grpo"])  # no critic


def test_liger_not_installed_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it raises ImportError
    why = kernels.liger_refusal(KEY, "qwen2", "cuda")
    assert why.startswith(f"{KEY}=True: liger-kernel cannot be imported") and "pip install 'rlrig[liger]'" in why
    assert "\n" not in why


def fake_liger(monkeypatch, calls: list) -> None:
    """liger_kernel.transformers.monkey_patch with Liger's table and a recording _apply_liger_kernel_to_instance."""
    patch = types.ModuleType("liger_kernel.transformers.monkey_patch")
    patch.MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen2": None, "llama": None}
    patch._apply_liger_kernel_to_instance = lambda **kw: calls.append(kw)
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, patch.__name__, patch)


def test_a_model_type_liger_does_not_patch_is_refused(monkeypatch):
    fake_liger(monkeypatch, [])
    why = kernels.liger_refusal(KEY, "gpt2", "cuda")
    assert why == f"{KEY}=True: Liger has no kernels for model type 'gpt2' (it has llama, qwen2); set {KEY}=False"
    assert kernels.liger_refusal(KEY, "qwen2", "cuda") is None


def test_apply_liger_makes_verl_call_on_the_model_instance(monkeypatch):
    from rlrig.trainer.embedded.tiny_model import build_model, build_tokenizer

    calls = []
    fake_liger(monkeypatch, calls)
    model = build_model(build_tokenizer())
    kernels.apply_liger(model, KEY, "cuda")
    assert calls == [{"model": model, "fused_linear_cross_entropy": False, "swiglu": True}]
    with pytest.raises(ConfigError, match="this run is on cpu"):
        kernels.apply_liger(model, KEY, "cpu")
    assert len(calls) == 1


@pytest.mark.process
def test_the_worker_applies_liger_to_the_actor_reference_and_critic(monkeypatch):
    """Every model verl's engines build from a section with use_liger: the actor and the reference
    (actor_rollout_ref.model) and the critic (critic.model), each once, right after it loads."""
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.workers import start_checks

    applied = []
    monkeypatch.setattr(kernels, "liger_device_refusal", lambda key, device: None)  # the CPU stands in for the GPU
    monkeypatch.setattr(start_checks, "liger_check", lambda *args: None)  # and stands in for Liger, not installed
    monkeypatch.setattr(kernels, "apply_liger", lambda m, key, device: applied.append((type(m).__name__, key)))
    overrides = [
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"{KEY}=True",
        "critic.model.use_liger=True",
    ]
    with single_worker(overrides) as (w, _):
        assert w.models.ref is not None and w.models.critic is not None
    assert sorted(applied) == [
        ("Qwen2ForCausalLM", KEY),
        ("Qwen2ForCausalLM", KEY),
        ("Qwen2ForTokenClassification", "critic.model.use_liger"),
    ]


def test_liger_patches_the_tiny_qwen2_with_verl_arguments(monkeypatch):
    """Liger itself (the liger extra), on the model instance: SwiGLU MLPs and RMSNorms replaced in every layer, the
    causal LM's forward left as it is (no fused linear cross-entropy). Nothing is run: Liger's kernels are Triton's.
    Liger also swaps classes and functions in transformers' qwen2 module; they are put back after the test."""
    pytest.importorskip("liger_kernel", reason="the liger extra (pip install 'rlrig[liger]') is not installed")
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    from transformers.models.qwen2 import modeling_qwen2

    from rlrig.trainer.embedded.tiny_model import build_model, build_tokenizer

    for name in ("apply_rotary_pos_emb", "Qwen2RMSNorm", "Qwen2MLP"):
        monkeypatch.setattr(modeling_qwen2, name, getattr(modeling_qwen2, name))
    model = build_model(build_tokenizer())
    forward = model.forward
    kernels.apply_liger(model, KEY, "cuda")
    layers = list(model.model.layers)
    assert all(layer.mlp.forward.__func__ is LigerSwiGLUMLP.forward for layer in layers)
    norms = [model.model.norm] + [
        n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)
    ]
    assert all(n.forward.__func__ is LigerRMSNorm.forward for n in norms)
    assert "forward" not in model.__dict__ and model.forward == forward
    assert modeling_qwen2.Qwen2MLP is LigerSwiGLUMLP  # the class swap, as Liger does for models built afterwards
    assert isinstance(model.lm_head, torch.nn.Linear)


def test_a_run_auto_resolved_to_cpu_refuses_liger_and_says_it_computes_uncompiled(monkeypatch, capsys):
    """trainer.device=auto on a machine without GPUs: the driver's checks once the device is known."""
    from rlrig.trainer.driver import prepare

    monkeypatch.setattr(prepare, "uses_gpu", lambda cfg: False)
    with pytest.raises(ConfigError, match=f"^{KEY}=True: .* this run is on cpu; set {KEY}=False"):
        prepare.resolved(parse_overrides([f"{KEY}=True"]), 10)
    assert prepare.resolved(parse_overrides([]), 10).trainer.device == "cpu"
    out = capsys.readouterr()
    lines = [x for x in (out.out + out.err).splitlines() if "use_torch_compile" in x]
    assert len(lines) == 1 and "this run is on CPU" in lines[0], lines


def test_each_node_checks_liger_against_the_model_before_any_worker_builds(monkeypatch):
    """workers/start_checks.py, run on every node: the model's type read from its config, the critic's from its own
    path."""
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.workers.start_checks import liger_check

    path = ensure_tiny_model()
    calls = []
    fake_liger(monkeypatch, calls)
    cfg = parse_overrides(["trainer.device=cuda", *GPU_MICRO, f"{KEY}=True", "critic.model.use_liger=True"])
    assert liger_check(cfg, path, "cuda") is None
    monkeypatch.setattr(kernels, "_liger_models", lambda: {"llama": None})
    assert liger_check(cfg, path, "cuda").startswith(f"{KEY}=True: Liger has no kernels for model type 'qwen2'")
    critic_only = parse_overrides(["trainer.device=cuda", *GPU_MICRO, "critic.model.use_liger=True"])
    assert liger_check(critic_only, path, "cuda").startswith("critic.model.use_liger=True: Liger has no kernels")
    assert calls == []  # checked, not applied
