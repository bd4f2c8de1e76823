"""LoRA on the actor (trainer/lora.py): the merge a rollout engine receives, the checks before workers start,
and a worker that trains adapters only, with the reference being its adapters disabled."""

import copy

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model import lora
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process


def model_cfg(*overrides):
    return parse_overrides(list(overrides)).actor_rollout_ref.model


def tiny_peft(*overrides):
    from transformers import AutoModelForCausalLM

    module = lora.apply(AutoModelForCausalLM.from_pretrained(ensure_tiny_model()), model_cfg(*overrides))
    torch.manual_seed(0)
    with torch.no_grad():  # peft starts B at zero (the merge would be the base): give every adapter a value
        for name, p in module.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return module


def test_merged_by_hand():
    # W + scaling * B @ A with W = I, A = [[1, 2]], B = [[1], [0]], scaling 2 -> [[3, 4], [0, 1]]
    stream = [
        ("base_model.model.proj.base_layer.weight", torch.eye(2)),
        ("base_model.model.proj.base_layer.bias", torch.ones(2)),
        ("base_model.model.proj.lora_A.default.weight", torch.tensor([[1.0, 2.0]])),
        ("base_model.model.proj.lora_B.default.weight", torch.tensor([[1.0], [0.0]])),
        ("base_model.model.norm.weight", torch.full((2,), 5.0)),
    ]
    out = dict(lora.merged({"base_model.model.proj": 2.0}, stream))
    assert list(out) == ["proj.bias", "proj.weight", "norm.weight"]
    assert out["proj.weight"].tolist() == [[3.0, 4.0], [0.0, 1.0]]
    assert out["proj.bias"].tolist() == [1.0, 1.0] and out["norm.weight"].tolist() == [5.0, 5.0]


def test_merged_keeps_the_base_dtype():
    stream = [
        ("base_model.model.p.base_layer.weight", torch.zeros(2, 2, dtype=torch.bfloat16)),
        ("base_model.model.p.lora_A.default.weight", torch.ones(1, 2)),
        ("base_model.model.p.lora_B.default.weight", torch.ones(2, 1)),
    ]
    ((name, t),) = lora.merged({"base_model.model.p": 0.5}, stream)
    assert name == "p.weight" and t.dtype == torch.bfloat16 and t.float().tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_merged_refuses_a_layer_left_incomplete():
    with pytest.raises(RuntimeError, match="base_model.model.p"):
        list(lora.merged({"base_model.model.p": 1.0}, [("base_model.model.p.lora_A.default.weight", torch.ones(1, 2))]))


@pytest.mark.parametrize(
    "overrides",
    [
        ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8"],
        [
            "actor_rollout_ref.model.lora_rank=2",
            "actor_rollout_ref.model.lora_alpha=32",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
        ],
        ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.exclude_modules=.*mlp.*"],
    ],
)
def test_merged_equals_peft_merge_and_unload(overrides):
    module = tiny_peft(*overrides)
    ours = dict(lora.merged(lora.scalings(module), module.state_dict().items()))
    theirs = copy.deepcopy(module).merge_and_unload().state_dict()
    assert sorted(ours) == sorted(theirs)
    for k, t in theirs.items():
        torch.testing.assert_close(ours[k], t, rtol=1e-5, atol=1e-6, msg=k)
    # and the merge is not the base: the adapters count
    assert any(
        not torch.equal(ours[k], module.state_dict()[f"base_model.model.{k[: -len('weight')]}base_layer.weight"])
        for k in ours
        if k.endswith("q_proj.weight")
    )


def test_exclude_modules_leaves_those_layers_plain():
    module = tiny_peft("actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.exclude_modules=.*mlp.*")
    adapted = set(lora.scalings(module))
    assert adapted and not any(".mlp." in n for n in adapted)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[no_such_proj]"],
            "actor_rollout_ref.model.target_modules=['no_such_proj']",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[embed_tokens,q_proj]"],
            "rlrig merges adapters of linear layers only",
        ),
        (["actor_rollout_ref.model.lora_adapter_path=/nonexistent/adapter"], "no peft adapter there"),
    ],
)
def test_check_refuses_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as e:
        lora.check(model_cfg(*overrides), ensure_tiny_model(), {})
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_check_refuses_a_dora_adapter(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    get_peft_model(
        AutoModelForCausalLM.from_pretrained(ensure_tiny_model()), LoraConfig(r=2, use_dora=True)
    ).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="a DoRA adapter"):
        lora.check(model_cfg(f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"), ensure_tiny_model(), {})


def test_check_reads_an_adapter_directory(tmp_path):
    tiny_peft(
        "actor_rollout_ref.model.lora_rank=2",
        "actor_rollout_ref.model.lora_alpha=6",
        "actor_rollout_ref.model.target_modules=[q_proj]",
    ).save_pretrained(tmp_path)
    got = lora.check(model_cfg(f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"), ensure_tiny_model(), {})
    assert got["r"] == 2 and got["lora_alpha"] == 6 and got["target_modules"] == ["q_proj"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["actor_rollout_ref.model.lora_rank=-1"], "the rank is 0 (no LoRA) or more"),
        (["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=0"], "the alpha above 0"),
        (["actor_rollout_ref.model.target_modules=[]"], "give all-linear, a module-name regex, or a list"),
        (
            [
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.ref.enable_resource_pool=True",
                "actor_rollout_ref.ref.nnodes=1",
                "actor_rollout_ref.ref.n_gpus_per_node=1",
            ],
            "the reference is the actor with its adapters disabled",
        ),
        (
            ["critic.model.lora_rank=8"],
            "critic.model.lora_rank: a verl key rlrig does not implement: LoRA on the critic",
        ),
    ],
)
def test_config_refusals(overrides, message):
    with pytest.raises(ConfigError) as e:
        parse_overrides(overrides)
    assert message in str(e.value)


TRAIN = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.optim.lr=1e-2",
]


def base_weights(module) -> dict:
    return {k: v.clone() for k, v in module.state_dict().items() if "lora_" not in k}


@pytest.mark.parametrize("strategy, checkpointing", [("ddp", False), ("fsdp", False), ("ddp", True)])
def test_a_worker_trains_the_adapters_only_against_its_disabled_self(strategy, checkpointing):
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.model.forward import token_logprobs

    with single_worker(
        [
            *TRAIN,
            f"actor_rollout_ref.actor.strategy={strategy}",
            f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}",
        ]
    ) as (w, batches):
        m = w.models
        assert m.ref is None and m.ref_in_actor
        trained = {id(p) for g in m.actor.opt.param_groups for p in g["params"]}
        assert trained == {id(p) for n, p in m.actor.module.named_parameters() if "lora_" in n}
        before = base_weights(m.actor.module)
        first = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        assert first["actor/kl_loss"] == pytest.approx(0.0, abs=1e-7)  # B starts at zero: the actor is its reference
        w.step(StepRequest(next(batches), global_step=2, kl_coef=0.0))
        after = m.actor.module.state_dict()
        for k, v in before.items():
            assert torch.equal(v, after[k]), f"{k}: a frozen weight changed"
        ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
        mask = torch.ones_like(ids)
        with torch.no_grad():
            live = token_logprobs(m.actor.module, ids, mask, 2)[0]
            with m.actor.module.disable_adapter():
                disabled = token_logprobs(m.actor.module, ids, mask, 2)[0]
        plain = copy.deepcopy(m.gen_module) if strategy == "fsdp" else None
        assert not torch.allclose(live, disabled)  # the adapters learned something
        with torch.no_grad():  # and with them disabled it is the model as loaded
            torch.testing.assert_close(
                disabled, token_logprobs(AutoModelForCausalLM.from_pretrained(ensure_tiny_model()), ids, mask, 2)[0]
            )
        if plain is not None:  # FSDP: the engine's full copy holds the merged weights, the live policy
            with torch.no_grad():
                torch.testing.assert_close(token_logprobs(plain, ids, mask, 2)[0], live, rtol=1e-4, atol=1e-5)


def test_resume_fields_are_json_plain():
    import json

    got = lora.resume_fields(tiny_peft("actor_rollout_ref.model.lora_rank=4").peft_config[lora.ADAPTER])
    assert json.loads(json.dumps(got)) == got and got["r"] == 4 and isinstance(got["target_modules"], list)


ADAPTER = {
    "r": 4,
    "lora_alpha": 8,
    "target_modules": ["q_proj"],
    "exclude_modules": None,
    "use_rslora": False,
    "rank_pattern": {},
    "alpha_pattern": {},
}


@pytest.mark.parametrize(
    "saved, now, message",
    [
        (None, None, None),
        (ADAPTER, dict(ADAPTER), None),
        (ADAPTER, None, "holds LoRA adapters (r=4, lora_alpha=8, 1 layers), but this run trains all weights"),
        (None, ADAPTER, "holds no LoRA adapters, but this run trains LoRA adapters"),
        (
            ADAPTER,
            {**ADAPTER, "r": 8},
            "this run trains LoRA adapters (r=8, lora_alpha=8, 1 layers); resume with the same",
        ),
    ],
)
def test_check_resume(saved, now, message):
    if message is None:
        lora.check_resume(saved, now, "/ckpt/global_step_2")
        return
    with pytest.raises(ConfigError) as e:
        lora.check_resume(saved, now, "/ckpt/global_step_2")
    assert message in str(e.value) and str(e.value).startswith("/ckpt/global_step_2 holds")


def test_training_goes_on_from_an_adapter_directory(tmp_path):
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.model.forward import token_logprobs

    saved = tiny_peft(
        "actor_rollout_ref.model.lora_rank=2",
        "actor_rollout_ref.model.lora_alpha=4",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
    )
    saved.save_pretrained(tmp_path)
    ids, mask = torch.tensor([[5, 6, 7, 8, 9, 10]]), torch.ones(1, 6, dtype=torch.long)
    with torch.no_grad():
        expected = token_logprobs(saved, ids, mask, 2)[0]
    rest = [x for x in TRAIN if "lora_" not in x]
    with single_worker([*rest, f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"]) as (w, batches):
        module = w.models.actor.module
        assert set(lora.scalings(module)) == {
            n for n in lora.scalings(saved)
        }  # the adapter's own targets, not all-linear
        with torch.no_grad():
            torch.testing.assert_close(token_logprobs(module, ids, mask, 2)[0], expected)
        first = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.0))
        assert first["actor/kl_loss"] > 1e-6  # the reference is the base (0 exactly were it the adapted actor)
        assert all(p.requires_grad for n, p in module.named_parameters() if "lora_" in n)


def test_padding_free_forwards_train_lora_as_padded_ones():
    """verl's LoRA scripts set use_remove_padding=True: the packed forwards pass through peft's wrapper unchanged."""
    from rlrig.trainer.driver.single_process import run_steps

    keys = ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "critic/score/mean")
    more = [*TRAIN, "actor_rollout_ref.actor.ppo_epochs=2"]  # a second epoch: KL and ratios away from their start
    padded, packed = run_steps(more, 3), run_steps([*more, "actor_rollout_ref.model.use_remove_padding=True"], 3)
    assert any(r["actor/kl_loss"] > 0 for r in padded)
    for a, b in zip(padded, packed):
        assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-4, abs=1e-6)
