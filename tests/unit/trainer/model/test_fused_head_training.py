"""actor_rollout_ref.model.use_fused_kernels through the training worker: a few steps give the metrics of the chunked
path, under DDP and FSDP2, padded and packed, in fp32 and bf16; two sequence-parallel ranks give one process's
log-probs, entropy and gradients; and the start-up check refuses, in one line, a head the fused pass cannot
replace."""

import os

import pytest
import torch
import torch.distributed as dist

from rlrig.trainer.model import forward as F
from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process

SMALL = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.max_response_length=8",
    "actor_rollout_ref.actor.use_kl_loss=True",  # the reference's pass too
    "actor_rollout_ref.actor.entropy_coeff=0.01",  # the entropy's gradient too
    "actor_rollout_ref.rollout.temperature=0.7",
]
NOT_COMPARED = ("timing_s/", "perf/")


def _counting(monkeypatch) -> list:
    calls = []
    real = F.fused_logprobs_and_entropy
    monkeypatch.setattr(F, "fused_logprobs_and_entropy", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@pytest.mark.parametrize(
    "strategy, remove_padding, param_dtype, steps, rel",
    [
        ("ddp", False, "fp32", 2, 1e-5),
        ("ddp", True, "fp32", 2, 1e-5),
        ("fsdp", False, "fp32", 2, 1e-5),
        ("fsdp", True, "fp32", 2, 1e-5),
        ("ddp", True, "bf16", 1, 3e-2),  # autocast's bf16 products: one step, whose samples do not depend on them
        ("fsdp", False, "bf16", 1, 3e-2),  # FSDP2's bf16 parameters
    ],
)
def test_training_with_a_fused_head_gives_the_chunked_paths_metrics(
    monkeypatch, strategy, remove_padding, param_dtype, steps, rel
):
    from rlrig.trainer.driver.single_process import run_steps

    overrides = [
        *SMALL,
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={param_dtype}",
        f"actor_rollout_ref.ref.fsdp_config.mixed_precision.param_dtype={param_dtype}",
    ]
    plain = run_steps([*overrides, "actor_rollout_ref.model.use_fused_kernels=False"], steps)
    calls = _counting(monkeypatch)
    fused = run_steps([*overrides, "actor_rollout_ref.model.use_fused_kernels=True"], steps)
    assert calls  # the fused head ran
    for a, b in zip(plain, fused):
        assert set(a) == set(b)
        for k, v in a.items():
            if not k.startswith(NOT_COMPARED):
                assert b[k] == pytest.approx(v, rel=rel, abs=rel * 1e-2), k


def _model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    conf = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        attention_dropout=0.0,
    )
    return Qwen2ForCausalLM(conf).eval()


def _outputs(model, sp, fused: bool):
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :2] = 0
    mask[1, 7:] = 0
    ids = ids * mask
    opts = F.ForwardOptions(remove_padding=True, sp=sp, temperature=0.7, with_entropy=True, fused_head=fused)
    logp, ent = F.token_logprobs(model, ids, mask, 4, opts)
    ((logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum() - 0.1 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    return {"logp": logp.detach(), "ent": ent.detach()}, grads


def _rank(rank, world, out_dir):
    from rlrig.trainer.model import ulysses

    outs, grads = _outputs(_model(), ulysses.make_groups(rank, world, world), fused=True)
    for g in grads.values():  # DDP's mean over the world: each rank holds its share of the group's gradient
        dist.all_reduce(g)
        g /= world
    torch.save({"outs": outs, "grads": grads}, os.path.join(out_dir, f"{rank}.pt"))


def test_two_sequence_parallel_ranks_with_a_fused_head_equal_one_chunked_process(tmp_path):
    gloo_ranks.run(2, _rank, str(tmp_path))
    want_outs, want_grads = _outputs(_model(), None, fused=False)
    for r in range(2):
        got = torch.load(tmp_path / f"{r}.pt")
        for k, t in want_outs.items():
            torch.testing.assert_close(got["outs"][k], t, atol=1e-5, rtol=1e-5)
        for name, g in want_grads.items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "overrides, refused",
    [
        ([], None),
        (["actor_rollout_ref.model.lora_rank=4"], None),  # all-linear: peft leaves the output layer alone
        (
            ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.target_modules=[q_proj,lm_head]"],
            "actor_rollout_ref.model.use_fused_kernels=True: the model's output head is "
            "peft.tuners.lora.layer.Linear, not a plain torch.nn.Linear; set it False",
        ),
        (
            ["+actor_rollout_ref.model.override_config.final_logit_softcapping=30.0"],
            "actor_rollout_ref.model.use_fused_kernels=True: qwen2's final_logit_softcapping=30.0 transforms the "
            "head's logits, which a fused head never makes; set it False",
        ),
    ],
)
def test_the_start_up_check_refuses_a_head_the_fused_pass_cannot_replace(overrides, refused):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.rollout.engines import engine_class
    from rlrig.trainer.workers.start_checks import start_refusal

    cfg = parse_overrides([*overrides, "actor_rollout_ref.model.use_fused_kernels=True"])
    engine = engine_class(cfg.actor_rollout_ref.rollout.name)
    assert start_refusal(cfg, ensure_tiny_model(), "cpu", engine) == refused
