"""What each trainer key does, shown on CPU: batch statistics over all workers, the learning-rate
schedule, precision choices, gradient checkpointing and micro batches counted with hooks, the
critic warm-up, the KL controller's sample count, and the phase timer."""

import math
import os
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.algos import core_algos as A
from rlrig.trainer.algos.estimators import AdvantageInput, get
from rlrig.trainer.config.presets import EMBEDDED
from rlrig.trainer.config.schema import FsdpConfig, MixedPrecisionConfig, OptimConfig
from rlrig.trainer.model import lr_schedule, precision
from rlrig.trainer.workers.step.request import StepRequest
from rlrig.trainer.workers.timing import Phases
from tests.helpers import gloo_ranks
from tests.helpers.model_hooks import embedded_tokens

pytestmark = pytest.mark.process

T = torch.tensor


def _batch(seed=0, rows=8, width=5):
    g = torch.Generator().manual_seed(seed)
    rewards = torch.randn(rows, width, generator=g)
    values = torch.randn(rows, width, generator=g)
    mask = (torch.arange(width)[None] < torch.randint(1, width + 1, (rows, 1), generator=g)).float()
    return rewards * mask, values * mask, mask


def _advantages(name, rewards, values, mask, allreduce):
    x = AdvantageInput(rewards, mask, list(range(len(mask))), values, 0.9, 0.95, True, allreduce)
    return get(name).fn(x)[0]


def _shard_worker(rank, world, out_dir):
    from rlrig.trainer.workers.step.context import allreduce_sum

    rewards, values, mask = _batch()
    half = len(mask) // world
    sl = slice(rank * half, (rank + 1) * half)
    res = {
        name: _advantages(name, rewards[sl], values[sl], mask[sl], allreduce_sum)
        for name in ("gae", "reinforce_plus_plus")
    }
    torch.save(res, os.path.join(out_dir, f"{rank}.pt"))


def test_batch_whitening_is_the_same_on_one_or_two_workers(tmp_path):
    """GAE and REINFORCE++ whiten over the whole batch (verl), so sharding it over workers changes nothing."""
    gloo_ranks.run(2, _shard_worker, str(tmp_path))
    rewards, values, mask = _batch()
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    for name in ("gae", "reinforce_plus_plus"):
        whole = _advantages(name, rewards, values, mask, A.local)
        torch.testing.assert_close(torch.cat([p[name] for p in parts]), whole, atol=1e-5, rtol=1e-5)
        # and it is not what each shard's own statistics give
        assert not torch.allclose(_advantages(name, rewards[:4], values[:4], mask[:4], A.local), whole[:4], atol=1e-3)


def test_masked_whiten_by_hand():
    # entries 1, 2, 3 (4 is masked): mean 2, unbiased var 1 -> -1, 0, 1
    out = A.masked_whiten(T([[1.0, 2.0], [3.0, 4.0]]), T([[1.0, 1.0], [1.0, 0.0]]))
    torch.testing.assert_close(out[T([[1.0, 1.0], [1.0, 0.0]]) > 0], T([-1.0, 0.0, 1.0]), atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "mode,value",
    [
        ("seq-mean-token-sum", 3.0),  # rows 1 and 2 only: (3 + 3) / 2; the all-masked row is left out (verl)
        ("seq-mean-token-mean", 2.25),  # (1.5 + 3) / 2
    ],
)
def test_seq_mean_modes_leave_out_rows_without_tokens(mode, value):
    loss = T([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0], [9.0, 9.0, 9.0]])
    mask = T([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    assert math.isclose(float(A.agg_loss(loss, mask, mode)), value, rel_tol=1e-6)


@pytest.mark.parametrize(
    "step,total,warmup,style,min_ratio,factor",
    [
        (0, 10, 0, "constant", 0.0, 1.0),
        (0, 10, 4, "constant", 0.0, 0.0),  # verl's warm-up starts at 0
        (2, 10, 4, "constant", 0.0, 0.5),  # 2 / 4
        (4, 10, 4, "constant", 0.0, 1.0),
        (0, 10, 0, "cosine", 0.0, 1.0),  # cos(0) = 1
        (5, 10, 0, "cosine", 0.0, 0.5),  # 0.5 (1 + cos(pi/2))
        (10, 10, 0, "cosine", 0.1, 0.1),  # the floor: min_lr_ratio
        (2, 10, 4, "cosine", 0.2, 0.6),  # 0.2 + 0.8 * 2/4
        (7, 10, 4, "cosine", 0.0, 0.5),  # p = 3/6: 0.5 (1 + cos(pi/2))
    ],
)
def test_lr_schedule(step, total, warmup, style, min_ratio, factor):
    assert lr_schedule.lr_factor(step, total, warmup, style, min_ratio) == pytest.approx(factor, abs=1e-9)


def test_lr_keys_as_verl_reads_them():
    o = OptimConfig(lr=1.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.3)
    assert lr_schedule.warmup_steps(o, 10) == 3
    o = OptimConfig(lr=2.0, lr_warmup_steps=2, lr_scheduler_type="constant", warmup_style="cosine", min_lr_ratio=0.5)
    assert lr_schedule.lr_at(o, 2, 10) == pytest.approx(2.0)  # warmup_style wins: cosine starts at its peak
    assert lr_schedule.lr_at(o, 10, 10) == pytest.approx(1.0)  # and ends at min_lr_ratio * lr


@pytest.mark.parametrize(
    "device,role,model_dtype,param_dtype,expect_model,expect_param",
    [
        ("cuda", "actor", None, None, torch.float32, torch.bfloat16),  # verl: fp32 master weights, bf16 compute
        ("cuda", "ref", None, None, torch.float32, torch.bfloat16),  # the reference too (verl's generated config)
        ("cuda", "ref", "bf16", None, torch.bfloat16, torch.bfloat16),
        ("cpu", "ref", "bf16", None, torch.bfloat16, torch.bfloat16),  # held in bf16 on CPU: computes in it
        ("cpu", "actor", None, None, torch.float32, torch.float32),  # CPU stays fp32 unless asked
        ("cpu", "ref", None, None, torch.float32, torch.float32),
        ("cpu", "actor", None, "bf16", torch.float32, torch.bfloat16),  # asked
        ("cuda", "critic", "bf16", "bf16", torch.bfloat16, torch.bfloat16),
    ],
)
def test_precision_defaults(device, role, model_dtype, param_dtype, expect_model, expect_param):
    fc = FsdpConfig(model_dtype=model_dtype, mixed_precision=MixedPrecisionConfig(param_dtype=param_dtype))
    p = precision.resolve(fc, device, "ddp", role)
    assert (p.model_dtype, p.param_dtype) == (expect_model, expect_param)


def test_buffers_keep_their_dtype_in_a_bf16_model():
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    model = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.bfloat16)
    floats = lambda: {b.dtype for b in model.buffers() if b.is_floating_point()}
    for buffer_dtype, expect in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        fc = FsdpConfig(model_dtype="bf16", mixed_precision=MixedPrecisionConfig(buffer_dtype=buffer_dtype))
        precision.cast_buffers(model, precision.resolve(fc, "cpu", "ddp", "actor"))
        assert floats() == {expect}


def test_autocast_for_ddp_policy_for_fsdp():
    fc = FsdpConfig(mixed_precision=MixedPrecisionConfig(param_dtype="bf16"))
    ddp, fsdp = precision.resolve(fc, "cpu", "ddp", "actor"), precision.resolve(fc, "cpu", "fsdp", "actor")
    with ddp.autocast():
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    with fsdp.autocast():
        assert not torch.is_autocast_enabled("cpu")
    assert fsdp.fsdp_policy().param_dtype == torch.bfloat16 and fsdp.fsdp_policy().reduce_dtype == torch.float32
    assert precision.resolve(FsdpConfig(), "cpu", "fsdp", "actor").fsdp_policy() is None


def test_phases_time_named_blocks():
    synced = []
    ph = Phases(lambda: synced.append(1))
    with ph("gen"):
        pass
    with ph("gen"):
        pass
    with ph("adv"):
        pass
    assert set(ph.metrics()) == {"timing_s/gen", "timing_s/adv"} and len(synced) == 6


def test_kl_controller_adapts_by_samples_not_prompts():
    from rlrig.trainer.algos.core_algos import AdaptiveKLController
    from rlrig.trainer.driver.modes import update_kl_controller

    cfg = SimpleNamespace(
        data=SimpleNamespace(train_batch_size=4), actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=5))
    )
    c = AdaptiveKLController(0.1, 0.1, 100)
    m = {"actor/reward_kl_penalty": 0.2}
    update_kl_controller(c, m, cfg)
    # error 0.2 (clipped), n_steps = 4 x 5 = 20: 0.1 * (1 + 0.2 * 20 / 100) = 0.104
    assert m["actor/reward_kl_penalty_coeff"] == pytest.approx(0.104)


# --- the worker's passes, counted with hooks (one rank in this process, Gloo) ---


def _count_calls(module):
    calls = [0]
    return calls, module.register_forward_hook(lambda *a: calls.__setitem__(0, calls[0] + 1))


def _one_step(extra, hook=lambda w: None):
    from rlrig.trainer.driver.single_process import single_worker

    with single_worker([*EMBEDDED, "actor_rollout_ref.rollout.name=hf", *extra]) as (w, batches):
        counters = hook(w)
        before = [p.detach().clone() for p in w.models.actor.module.parameters()]
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001))
        changed = any(not torch.equal(a, p) for a, p in zip(before, w.models.actor.module.parameters()))
        return out, changed, counters


def test_gradient_checkpointing_recomputes_the_update_only():
    # the layer's first projection, which every recompute runs: hooks on the layer itself rerun under transformers 5.19
    # (it checkpoints the layer's __call__) but not under 5.2x (its forward); the recompute stops inside the MLP once
    # the last saved tensor is rebuilt
    hook = lambda w: _count_calls(w.models.actor.module.model.layers[0].self_attn.q_proj)[0]
    micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"
    plain = _one_step([micro], hook)[2][0]
    ckpt = _one_step([micro, "actor_rollout_ref.model.enable_gradient_checkpointing=True"], hook)[2][0]
    # 32 prompts x 8 samples on one worker, mini batch 16 x 8 = 128 rows, micro 32: 8 update micro batches
    assert ckpt - plain == 8, (plain, ckpt)


@pytest.mark.parametrize(
    "key,micro,calls",
    [
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", None, 1),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 64, 4),  # 256 rows / 64
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", 100, 3),  # 100, 100, 56
    ],
)
def test_log_prob_passes_run_in_micro_batches(key, micro, calls):
    hook = lambda w: _count_calls(w.models.ref)[0]
    extra = [f"{key}={micro}"] if micro else []
    assert _one_step(extra, hook)[2][0] == calls


def test_old_log_prob_micro_batches():
    hook = lambda w: _count_calls(w.models.actor.module)[0]
    # generation calls the module once per token: compare against the same run without micro batches
    base = _one_step([], hook)[2][0]
    micro = _one_step(["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32"], hook)[2][0]
    assert micro - base == 256 // 32 - 1


def test_critic_warmup_holds_the_actor():
    out, changed, _ = _one_step(["trainer.critic_warmup=2"])
    assert not changed and "actor/lr" not in out and "timing_s/update_actor" not in out
    out, changed, _ = _one_step(["trainer.critic_warmup=1"])
    assert changed and out["actor/lr"] == pytest.approx(5e-4)


def test_balance_batch_reports_verls_metrics_and_turns_off():
    on, _, _ = _one_step([])  # one worker: nothing to trade, the metrics as verl logs them still
    off, _, _ = _one_step(["trainer.balance_batch=False"])
    assert on["global_seqlen/balanced_max"] == on["global_seqlen/max"] == on["perf/total_num_tokens"] > 0
    assert "timing_s/balance" in on and not any(k.startswith("global_seqlen/") or k == "timing_s/balance" for k in off)


def test_lr_warmup_reaches_the_optimizer():
    out, changed, _ = _one_step(["actor_rollout_ref.actor.optim.lr_warmup_steps=4"])
    assert out["actor/lr"] == 0.0 and not changed  # step 1 of a warm-up from 0, as verl


def test_prompt_key_names_the_column(tmp_path):
    from rlrig.trainer.data.datasets import arithmetic_rows, write_parquet
    from rlrig.trainer.errors import ConfigError

    rows = [{("question" if k == "prompt" else k): v for k, v in r.items()} for r in arithmetic_rows(64, "train", 1)]
    write_parquet(rows, tmp_path / "t.parquet")
    files = [f"data.train_files={tmp_path / 't.parquet'}", f"data.val_files={tmp_path / 't.parquet'}"]
    out, _, _ = _one_step([*files, "data.prompt_key=question"])
    assert out["response_length/mean"] > 0
    with pytest.raises(ConfigError, match="data.prompt_key=prompt: the data has no such column"):
        _one_step(files)


def test_every_offload_key_runs_through_a_step_under_fsdp():
    """On CPU the moves are to where the tensors already are, so this checks the code path and that
    the numbers do not move; tests/gpu checks where the tensors rest on CUDA."""
    base = ["actor_rollout_ref.actor.strategy=fsdp", "algorithm.adv_estimator=gae", "trainer.device=cpu"]
    offload = [
        f"{k}=True"
        for k in (
            "actor_rollout_ref.actor.fsdp_config.param_offload",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
            "actor_rollout_ref.ref.fsdp_config.param_offload",
            "critic.model.fsdp_config.param_offload",
            "critic.model.fsdp_config.optimizer_offload",
        )
    ]
    keys = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "actor/kl_loss")
    plain, _, _ = _one_step(base)
    moved, changed, _ = _one_step([*base, *offload])
    assert changed and [plain[k] for k in keys] == pytest.approx([moved[k] for k in keys], rel=1e-6)


def test_the_hf_engine_generates_under_fsdp_with_a_copy_in_the_compute_dtype():
    """Mixed precision (asked for on CPU, as on every GPU by default): the full copy the hf engine generates
    with holds the actor's weights in bf16 (half an fp32 copy), its rotary buffers in fp32, and a step runs."""
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.model import parallel

    with single_worker(
        [
            *EMBEDDED,
            "actor_rollout_ref.rollout.name=hf",
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16",
        ]
    ) as (w, batches):
        gen = w.models.gen_module
        assert {p.dtype for p in gen.parameters()} == {torch.bfloat16}
        assert {b.dtype for b in gen.buffers() if b.is_floating_point()} == {torch.float32}
        live = dict(parallel.full_tensors(w.models.actor.module))
        assert live and all(torch.equal(t.to(torch.bfloat16), gen.state_dict()[n]) for n, t in live.items())
        out = w.step(StepRequest(next(batches), global_step=1, kl_coef=0.001))
        assert out["actor/grad_norm"] > 0 and out["response_length/mean"] > 0


@pytest.mark.parametrize(
    "extra",
    [
        [],  # on-policy: the update's own forward gives the old log-probs; the reference's pass
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=48",
        ],
        [
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        ],
        ["actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=300"],
        [
            "actor_rollout_ref.model.lora_rank=4",
            "actor_rollout_ref.model.lora_alpha=8",
        ],  # the reference: adapters disabled
    ],
)
def test_prefix_grouper_steps_as_the_padded_forwards_do(extra):
    """Every pass that shares prompts (old log-probs, reference, update) gives the padded passes' numbers;
    the embedding counts fewer tokens."""
    tokens = lambda w: embedded_tokens(*({w.models.actor.module, w.models.ref} - {None}))[0]
    keys = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac", "actor/ppo_kl")
    plain, _, plain_tokens = _one_step(extra, tokens)
    shared, changed, shared_tokens = _one_step([*extra, "actor_rollout_ref.actor.use_prefix_grouper=True"], tokens)
    assert changed and [shared[k] for k in keys] == pytest.approx([plain[k] for k in keys], rel=1e-4, abs=1e-6)
    assert shared_tokens[0] < plain_tokens[0]


def test_prefix_grouper_refuses_a_sliding_window_model_at_start_up(tmp_path):
    from transformers import AutoConfig

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.errors import ConfigError
    from rlrig.trainer.model import prefix_grouper

    prefix_grouper.check(ensure_tiny_model(), {})
    conf = AutoConfig.from_pretrained(ensure_tiny_model())
    conf.use_sliding_window, conf.sliding_window, conf.max_window_layers = True, 4, 0
    conf.layer_types = ["sliding_attention"] * conf.num_hidden_layers
    conf.save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="use_prefix_grouper=True needs a model whose every layer"):
        prefix_grouper.check(str(tmp_path), {})


def test_the_critic_trains_without_dropout():
    """transformers gives a token-classification head dropout 0.1; verl sets it to 0, and since the update runs in
    training mode it would otherwise make the critic's update random (padded and packed runs would differ)."""
    seen = []
    _one_step(
        ["algorithm.adv_estimator=gae"],
        lambda w: seen.extend(m.p for m in w.models.critic.module.modules() if isinstance(m, torch.nn.Dropout)),
    )
    assert seen and set(seen) == {0.0}


def test_draws_inside_forked_rngs_leave_every_global_stream_as_it_was():
    import random

    import numpy as np

    from rlrig.trainer.workers.base import forked_rngs

    def draws():
        return torch.rand(3).tolist(), np.random.randint(0, 2**31, 3).tolist(), [random.random() for _ in range(3)]

    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    expected = draws()
    torch.manual_seed(1), np.random.seed(1), random.seed(1)
    with forked_rngs(torch.device("cpu")):
        draws()  # the update's dropout, say
    assert draws() == expected


@pytest.mark.parametrize(
    "extra, critic_steps",
    [
        ([], 2),  # the actor's: 32 prompts in mini batches of 16, one epoch
        (["critic.ppo_mini_batch_size=8"], 4),
        (["critic.ppo_epochs=2"], 4),
        (["critic.ppo_mini_batch_size=8", "critic.ppo_epochs=3"], 12),
    ],
)
def test_the_critic_takes_its_own_mini_batches_and_epochs(extra, critic_steps):
    def hook(w):
        steps, opt = [0], w.models.critic.opt
        step = opt.step
        opt.step = lambda *a, **k: (steps.__setitem__(0, steps[0] + 1), step(*a, **k))[1]
        return steps

    out, _, steps = _one_step(["algorithm.adv_estimator=gae", *extra], hook)
    assert steps[0] == critic_steps and "critic/vf_loss" in out


def test_every_log_prob_pass_divides_by_the_rollout_temperature(monkeypatch):
    # verl: old log-probs, the reference's and the update's all come from logits / rollout.temperature
    from rlrig.trainer.model import forward
    from rlrig.trainer.workers.step import sources

    seen = []

    outputs = forward.token_outputs

    def spy(model, ids, mask, prompt_len, opts):
        seen.append(opts.temperature)
        return outputs(model, ids, mask, prompt_len, opts)

    monkeypatch.setattr(forward, "token_outputs", spy)  # the update's, through token_logprobs
    monkeypatch.setattr(sources, "token_outputs", spy)
    extra = ["actor_rollout_ref.rollout.temperature=0.5", "actor_rollout_ref.actor.use_kl_loss=True"]
    _one_step([*extra, "actor_rollout_ref.actor.ppo_epochs=2"])
    # old log-probs (2 epochs: not on-policy), the reference's, and each update micro batch
    assert len(seen) >= 3 and set(seen) == {0.5}


@pytest.mark.parametrize(
    "extra,in_update,in_old_pass",
    [
        # on-policy (one mini batch, one epoch): the update's first forwards stand in for the old pass
        (["actor_rollout_ref.actor.ppo_mini_batch_size=32"], True, False),
        # the embedded default's two mini batches: verl 0.9's old-log-prob pass computes the entropy, its update not
        ([], False, True),
        (["actor_rollout_ref.actor.calculate_entropy=True"], True, False),
        (["actor_rollout_ref.actor.entropy_coeff=0.01"], True, False),
    ],
)
def test_the_entropy_is_computed_where_verl_computes_it(monkeypatch, extra, in_update, in_old_pass):
    from rlrig.trainer.model import forward
    from rlrig.trainer.workers.step import sources

    seen = []  # (with a gradient: the update's forwards; without: the no-grad passes), with_entropy
    outputs = forward.token_outputs

    def spy(model, ids, mask, prompt_len, opts):
        seen.append((torch.is_grad_enabled(), opts.with_entropy, opts.entropy_grad))
        return outputs(model, ids, mask, prompt_len, opts)

    monkeypatch.setattr(forward, "token_outputs", spy)
    monkeypatch.setattr(sources, "token_outputs", spy)
    out, _, _ = _one_step(extra)
    update = {e for g, e, _ in seen if g}
    no_grad = {e for g, e, _ in seen if not g}
    assert update == {in_update}
    assert (True in no_grad) == in_old_pass  # the reference's pass never computes it
    grads = {eg for g, e, eg in seen if g and e}
    assert grads <= {"entropy_coeff=0.01" in " ".join(extra)}  # a gradient through the entropy only for its loss
    assert math.isfinite(out["actor/entropy"]) and out["actor/entropy"] > 0
