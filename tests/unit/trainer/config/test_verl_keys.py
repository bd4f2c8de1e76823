"""The verl keys rlrig took on in this round, each shown to do what verl does with it."""

import math
import sys

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/m"


@pytest.mark.parametrize("kind,base", [("k3+", "k3"), ("low_var_kl+", "low_var_kl"), ("k1+", "k1"), ("abs+", "abs")])
def test_straight_through_kl_has_its_value_and_k2s_gradient(kind, base):
    logp = torch.tensor([0.0, -1.0], requires_grad=True)
    ref = torch.tensor([math.log(0.5), -0.5])
    v = A.kl_penalty(logp, ref, kind)
    torch.testing.assert_close(v.detach(), A.kl_penalty(logp.detach(), ref, base))
    v.sum().backward()
    torch.testing.assert_close(logp.grad, (logp - ref).detach())  # d/dlogp 0.5 (logp - ref)^2


def test_top_k_one_samples_the_greedy_token():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.rollout.engines import GREEDY, EngineContext, Sampling
    from rlrig.trainer.rollout.engines.hf_engine import HFRollout

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    eng = HFRollout(
        EngineContext(AutoModelForCausalLM.from_pretrained(path), tok, RolloutConfig(), 8, 8, path, "cpu", 0)
    )
    prompts = [tok(q)["input_ids"] for q in ("3+4=", "7+8=", "1+1=")]
    torch.manual_seed(0)
    top1 = eng.generate(prompts, 2, Sampling(1.0, 1.0, 1, True))
    assert torch.equal(top1.input_ids, eng.generate(prompts, 2, GREEDY).input_ids)


def test_apply_chat_template_kwargs_reach_the_template():
    from rlrig.trainer.data.datasets import arithmetic_rows, tokenize_prompts
    from rlrig.trainer.embedded.tiny_model import build_tokenizer

    tok = build_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if effort %}{{ effort }}{% endif %}"
    rows = arithmetic_rows(2, "train", 1)
    plain = tokenize_prompts(rows, tok, 32, "error", False)
    more = tokenize_prompts(rows, tok, 32, "error", False, template_kwargs={"effort": "9"})
    assert more[0]["input_ids"] == plain[0]["input_ids"] + tok("9")["input_ids"]


def test_dict_keys_take_hydra_items():
    cfg = parse_overrides(
        [
            MODEL,
            "+data.apply_chat_template_kwargs.reasoning_effort=medium",
            "actor_rollout_ref.model.override_config={attention_dropout:0.1}",
            "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        ]
    )
    assert cfg.data.apply_chat_template_kwargs == {"reasoning_effort": "medium"}
    assert cfg.actor_rollout_ref.model.override_config == {"attention_dropout": 0.1}
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"swap_space": 4}
    with pytest.raises(ConfigError, match="engine_kwargs.trtllm: rlrig's engines are hf, vllm, sglang"):
        parse_overrides([MODEL, "actor_rollout_ref.rollout.engine_kwargs.trtllm.x=1"])


def test_engine_kwargs_reach_the_engines():
    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.rollout.engines import sglang_engine, vllm_engine

    cfg = RolloutConfig(
        engine_kwargs={"vllm": {"swap_space": 4, "max_model_len": 99}, "sglang": {"attention_backend": "triton"}}
    )
    assert vllm_engine.engine_kwargs(cfg, "/m", 48, "cpu", 0)["swap_space"] == 4
    assert vllm_engine.engine_kwargs(cfg, "/m", 48, "cpu", 0)["max_model_len"] == 99  # the user's word is last
    assert sglang_engine.engine_kwargs(cfg, "/m", 48, 0)["attention_backend"] == "triton"


def test_override_config_and_trust_remote_code_reach_from_pretrained():
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.config.schema import ModelConfig
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model.loading import load_kwargs, model_kwargs

    assert load_kwargs(ModelConfig(path="/m", trust_remote_code=True)) == {"trust_remote_code": True}
    path = ensure_tiny_model()
    m = ModelConfig(path=path, override_config={"attention_dropout": 0.25, "rlrig_marker": 1})
    model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs(m, path))
    assert model.config.attention_dropout == 0.25 and model.config.rlrig_marker == 1


def test_external_lib_is_imported_or_refused(tmp_path, monkeypatch):
    from rlrig.trainer.config.schema import ModelConfig
    from rlrig.trainer.model.loading import import_external_lib

    (tmp_path / "my_model_lib.py").write_text("LOADED = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import_external_lib(ModelConfig(external_lib="my_model_lib"))
    assert sys.modules["my_model_lib"].LOADED
    with pytest.raises(ConfigError, match="external_lib=no_such_lib cannot be imported"):
        import_external_lib(ModelConfig(external_lib="no_such_lib"))


@pytest.mark.parametrize(
    "override,words",
    [
        ("critic.model.lora_rank=8", "a verl key rlrig does not implement: LoRA on the critic"),
        ("actor_rollout_ref.rollout.agent.custom_async_server.path=my.py", "a server class of your own is not in"),
        ("actor_rollout_ref.rollout.sglang_rollout_mode=server", "verl refuses it as well"),
        ("algorithm.rollout_correction.rollout_token_veto_threshold=1e-4", "token veto is not in its rollout"),
        ("reward_model.ulysses_sequence_parallel_size=2", "sequence parallelism for the reward model"),
        # the actor's is implemented (model/ulysses.py): groups of the one worker here cannot be formed
        ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "does not divide the 1 workers"),
        ("actor_rollout_ref.rollout.mode=agent", "verl's modes are async (its default) and sync"),
        ("trainer.logger=['console','clearml']", "clearml is not in rlrig"),
        ("data.sampler.class_name=Curriculum", "class_path is not; name the file or pkg:// module"),
        ("actor_rollout_ref.ref.strategy=ddp", "shards the reference as it does the actor"),  # the actor: fsdp
        ("actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=True", "nor in verl's agent loop"),
        ("actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=3", "CollabLLM is not in rlrig"),
        ("actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=loose", "choose one of strict, ignore_"),
    ],
)
def test_verl_keys_rlrig_does_not_implement_are_refused_in_one_line(override, words):
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "override",
    [
        "critic.model.lora_rank=0",
        "critic.model.target_modules=all-linear",
        "reward_model.use_reward_loop=False",
        "actor_rollout_ref.rollout.multi_turn.enable=False",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.over_sample_rate=0.1",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.mode=sync",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=1",
        "trainer.use_legacy_worker_impl=enable",
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.rollout.multi_turn.use_inference_chat_template=False",
        "actor_rollout_ref.rollout.multi_turn.num_repeat_rollouts=null",
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable",
        "actor_rollout_ref.model.use_shm=True",
        "data.dataloader_num_workers=0",
    ],
)
def test_verl_defaults_that_ask_for_nothing_are_accepted(override):
    parse_overrides([MODEL, "actor_rollout_ref.actor.strategy=fsdp", override])
