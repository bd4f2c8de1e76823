"""The actor's weights in the checkpoint's layout (model/checkpoint_names.py): for a mixture of experts, name for name
and tensor for tensor what transformers' save_pretrained writes, which is what vLLM's and SGLang's loaders read."""

import pytest
import torch
from safetensors.torch import load_file

from rlrig.trainer.model import checkpoint_names, lora
from rlrig.trainer.model.checkpoint_names import CheckpointLayout
from tests.helpers import tiny_moe


def saved(model, tmp_path) -> dict[str, torch.Tensor]:
    model.save_pretrained(tmp_path)
    return load_file(tmp_path / "model.safetensors")


def assert_same(got: list[tuple[str, torch.Tensor]], want: dict[str, torch.Tensor]) -> None:
    names = [n for n, _ in got]
    assert len(names) == len(set(names)), "a name twice"
    assert set(names) == set(want), (sorted(set(names) ^ set(want)))[:10]
    for name, t in got:
        assert t.dtype == want[name].dtype and torch.equal(t, want[name]), name


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
def test_an_moe_stream_is_what_save_pretrained_writes(tmp_path, family):
    model, _ = tiny_moe.build(family)
    sd = model.state_dict()
    assert any(t.dim() == 3 for t in sd.values()), "transformers no longer fuses this family's experts"
    want = saved(model, tmp_path)
    assert any(".experts.7." in n for n in want)  # the checkpoint's names: one per expert
    # the layout of a weightless model of the config, as an engine builds it from the model's folder
    assert_same(list(CheckpointLayout.of(model.config)(sd.items())), want)
    assert checkpoint_names.refusal(model.config) is None


# tiny sizes for the MoE configurations transformers holds fused; each reads the keys it has
SMALL = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    shared_expert_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    n_routed_experts=4,
    num_local_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    kv_lora_rank=16,
    q_lora_rank=16,
    qk_rope_head_dim=8,
    qk_nope_head_dim=8,
    v_head_dim=8,
    linear_num_value_heads=2,
    linear_num_key_heads=2,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
    max_position_embeddings=64,
)
FUSED = (
    "qwen2_moe",
    "qwen3_next",
    "deepseek_v2",
    "deepseek_v3",
    "glm4_moe",
    "gpt_oss",
    "olmoe",
    "phimoe",
    "granitemoe",
    "jamba",
    "hunyuan_v1_moe",
    "minimax",
    "ernie4_5_moe",
)


@pytest.mark.parametrize("model_type", FUSED)
def test_every_fused_family_reaches_what_save_pretrained_writes(tmp_path, model_type):
    """Other families than the two the engine tests run, from transformers' own conversion with no table of ours: the
    stream holds every tensor save_pretrained writes, equal, and besides them only the tied output head it leaves
    out (an engine ties it again or reads it as given)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = AutoConfig.for_model(model_type, **SMALL)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    assert any(t.dim() == 3 for t in model.state_dict().values()), "no fused experts: not a case for this test"
    want = saved(model, tmp_path)
    got = dict(CheckpointLayout.of(conf)(model.state_dict().items()))
    assert set(want) <= set(got) and set(got) - set(want) <= {"lm_head.weight"}, sorted(set(got) ^ set(want))[:6]
    if "lm_head.weight" not in want:
        assert conf.tie_word_embeddings
    for name in want:
        assert torch.equal(got[name], want[name]), name


def test_the_stream_is_reverted_a_block_at_a_time(tmp_path):
    """A layer's checkpoint tensors come out before the next layer's are read: the sync holds one block, not the
    model, as FSDP's gathered tensors arrive."""
    model, _ = tiny_moe.build("qwen3_moe")
    read: list[str] = []

    def reading():
        for name, t in model.state_dict().items():
            read.append(name)
            yield name, t

    for name, _ in CheckpointLayout(model)(reading()):
        if name.startswith("model.layers.0."):
            assert not any(n.startswith("model.layers.1.") for n in read[:-1]), name


def test_a_dense_model_passes_through_untouched():
    from transformers import Qwen2Config

    layout = CheckpointLayout.of(Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1))
    tensors = [("a.weight", torch.ones(2)), ("model.layers.0.b", torch.zeros(3))]
    assert not layout.converts and layout.model is None  # no model built: nothing of a dense Qwen2 is converted
    assert list(layout(iter(tensors))) == tensors
    assert checkpoint_names.refusal(Qwen2Config()) is None


def one_way_mapping(monkeypatch):
    """qwen3_moe's conversion replaced by one with no reverse (ConversionOps.reverse_op raises)."""
    from transformers import conversion_mapping as cm
    from transformers.core_model_loading import ConversionOps, WeightConverter

    class OneWay(ConversionOps):
        def convert(self, input_dict, source_patterns, target_patterns, **kwargs):
            return input_dict

    real = cm.get_checkpoint_conversion_mapping

    def mapping(model_type):
        if model_type == "qwen3_moe":
            return [WeightConverter("mlp.experts.*.w9.weight", "mlp.experts.gate_up_proj", operations=[OneWay()])]
        return real(model_type)

    monkeypatch.setattr(cm, "get_checkpoint_conversion_mapping", mapping)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf"])
@pytest.mark.parametrize("mappable", [True, False])
def test_start_up_refuses_only_an_architecture_that_cannot_be_reverted_and_names_it(
    tmp_path, monkeypatch, engine, mappable
):
    from rlrig.trainer.config.schema import ModelConfig
    from rlrig.trainer.rollout import engines
    from rlrig.trainer.workers.start_checks import layout_refusal

    tiny_moe.build("qwen3_moe")[0].config.save_pretrained(tmp_path)
    if not mappable:
        one_way_mapping(monkeypatch)
    cls = engines.ENGINES[engine]
    assert cls.checkpoint_layout == (engine != "hf")  # hf generates with transformers' own module: no reversion
    why = layout_refusal(ModelConfig(), str(tmp_path), cls)
    if mappable or engine == "hf":
        assert why is None
        return
    assert why.startswith(f"transformers {__import__('transformers').__version__} cannot convert qwen3_moe's"), why
    assert "no reverse" in why and f"which {engine} loads; use actor_rollout_ref.rollout.name=hf" in why
    assert "\n" not in why


def _gpt_oss_config():
    from transformers import GptOssConfig

    return GptOssConfig(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
    )  # fmt: skip


def _fp8_qwen_config():
    config = tiny_moe.build("qwen3_moe")[0].config
    config.quantization_config = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    return config


# the engine's own word on models whose weights its loader cannot take (model_refusal): None, or words it says
@pytest.mark.parametrize(
    "config, refusals",
    [
        (_gpt_oss_config, {"vllm": "vLLM's gpt-oss loader writes its experts", "sglang": None, "hf": None}),
        (
            _fp8_qwen_config,
            {
                "vllm": "quantization_config (fp8): vLLM would build quantized layers",
                "sglang": "quantization_config (fp8): SGLang would build quantized layers",
                "hf": None,
            },
        ),
    ],
)
def test_start_up_refuses_a_model_the_engines_loader_cannot_take(tmp_path, config, refusals):
    from rlrig.trainer.config.schema import ModelConfig
    from rlrig.trainer.rollout import engines
    from rlrig.trainer.workers.start_checks import layout_refusal

    config().save_pretrained(tmp_path)
    for engine, words in refusals.items():
        why = layout_refusal(ModelConfig(), str(tmp_path), engines.ENGINES[engine])
        assert (why is None) if words is None else (words in why and "\n" not in why), (engine, why)


@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf", None])
def test_what_the_weight_sync_yields_for_each_engine(tmp_path, engine):
    """workers/actor_weights.py, the stream a colocated sync takes: for an engine that reads checkpoints, the saved
    checkpoint's names and tensors; for hf, the module's own state dict; for a rollout pool (no engine of the
    worker's own), the module's own state dict too, which the pool's workers convert as they receive it."""
    from types import SimpleNamespace

    from rlrig.trainer.rollout import engines
    from rlrig.trainer.workers.actor_weights import ActorWeights

    model, _ = tiny_moe.build("qwen3_moe")
    cfg = SimpleNamespace(actor_rollout_ref=SimpleNamespace(model=SimpleNamespace(uses_lora=False)))
    models = SimpleNamespace(actor=SimpleNamespace(module=model))
    cls = engines.ENGINES[engine] if engine else None
    got = list(ActorWeights(cfg, models, torch.device("cpu"), 0, cls).tensors())
    assert_same(got, saved(model, tmp_path) if engine in ("vllm", "sglang") else dict(model.state_dict()))


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
@pytest.mark.parametrize("targets", ["all-linear", ["q_proj", "v_proj"]], ids=["all-linear", "attention"])
def test_lora_on_an_moe_merged_into_the_checkpoint_layout_is_peft_merge(tmp_path, family, targets):
    """LoRA on an MoE as peft allows it: all-linear adapts the attention, the fused experts and the router (the last two
    as parameters, peft's ParamWrapper). The merged stream (lora.merged) reverted is the checkpoint save_pretrained
    writes of peft's own merge_and_unload; lora.check takes the adapter."""
    from peft import LoraConfig, get_peft_model

    from rlrig.trainer.config.overrides import parse_overrides

    model, _ = tiny_moe.build(family)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=targets))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(std=0.1)  # B starts at zero: the merge would change nothing
    params = lora.parameter_adapters(peft_model)
    assert bool(params) == (targets == "all-linear")
    if params:
        assert any(p.experts == 8 and p.weight.endswith("gate_up_proj") for p in params.values())
        assert any(p.experts == 8 and p.weight.endswith("down_proj") for p in params.values())
    stream = lora.merged(lora.scalings(peft_model), peft_model.state_dict().items(), params)
    got = list(CheckpointLayout.of(model.config)(stream))
    want = saved(peft_model.merge_and_unload(), tmp_path)
    assert set(n for n, _ in got) == set(want)
    for name, t in got:
        assert torch.allclose(t, want[name], atol=1e-5), name
    keys = ["actor_rollout_ref.model.lora_rank=4", f"actor_rollout_ref.model.target_modules={targets}".replace("'", "")]
    lora.check(parse_overrides(keys).actor_rollout_ref.model, tiny_moe.ensure(family), {})


@pytest.mark.parametrize("family", tiny_moe.FAMILIES)
def test_an_moe_export_with_lora_on_its_experts_is_the_merged_checkpoint(tmp_path, family):
    """model/hf_export.py as `rlrig export` and a checkpoint's hf_model call it for an all-linear LoRA run: the folder
    holds the merged model in the checkpoint layout (one tensor per expert), and the adapter as peft saves it."""
    from peft import LoraConfig, get_peft_model

    from rlrig.trainer.model.hf_export import write_hf_model

    model, _ = tiny_moe.build(family)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.normal_(std=0.1)
    fields = lora.resume_fields(peft_model.peft_config[lora.ADAPTER])
    write_hf_model(peft_model.state_dict(), tiny_moe.ensure(family), tmp_path / "hf", lora=fields)
    got = load_file(tmp_path / "hf" / "model.safetensors")
    want = saved(peft_model.merge_and_unload(), tmp_path / "want")
    assert set(got) == set(want) and any(".experts.7." in n for n in got)
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-5), name
    assert (tmp_path / "hf" / "lora_adapter" / "adapter_model.safetensors").is_file()
