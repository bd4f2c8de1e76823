"""The embedded tool task for real (rlrig train --preset tools, the hf engine): through verl's tool agent loop with the
calculator, the reward rises as the model learns to call it and to copy what it returns."""

from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration

STEPS = 30


def tool_task(run: Path, *extra: str, steps: int = STEPS) -> list[dict]:
    """`rlrig train --preset tools` for `steps` steps (validated and checkpointed at the end): its metrics."""
    r = rlrig(
        "train",
        "--preset",
        "tools",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        f"trainer.save_freq={steps}",
        f"trainer.default_local_dir={run}",
        *extra,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return metrics(run)


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def check_it_learned(rows: list[dict]) -> dict:
    """The first and last fifth of the run: the score, the calls per sample and the turns per sample."""
    steps = [r for r in rows if "critic/score/mean" in r]  # (the first line: validation before training)
    k = STEPS // 5
    first, last = steps[:k], steps[-k:]
    seen = {
        key: (round(mean(first, key), 3), round(mean(last, key), 3))
        for key in ("critic/score/mean", "tool_call_counts/mean", "num_turns/mean")
    }
    print(seen)
    score, calls, turns = seen.values()
    assert score[1] > score[0] + 0.2, seen  # the reward rises
    assert calls[1] > calls[0], seen  # by calling the calculator more
    assert 2 <= turns[0] and turns[1] <= 4, seen  # a call, the calculator's response, the answer: 4 turns at most
    val = [r for r in rows if "val-core/rlrig/calculator/reward/mean@1" in r]
    assert len(val) == 2 and "val-aux/num_turns/mean" in val[-1]
    assert val[-1]["val-core/rlrig/calculator/reward/mean@1"] > val[0]["val-core/rlrig/calculator/reward/mean@1"]
    for key in ("timing_s/agent_loop/generate_sequences/mean", "timing_s/agent_loop/tool_calls/max"):
        assert key in rows[-1], key
    return seen


# long: 30 steps of learning; CI keeps vLLM's (tests/vllm_tier) and the tool task on every pool mode here
@pytest.mark.long
def test_the_embedded_tool_task_learns_to_use_the_calculator(tmp_path):
    check_it_learned(tool_task(tmp_path / "run", "actor_rollout_ref.rollout.name=hf"))


# fully async: an update of 16 prompts at a time, a weight sync after each, the engines up to a version ahead, and
# partial rollouts: a sync halts the trajectories in flight mid-turn and they go on under the new weights
FULLY_ASYNC = [
    "data.train_batch_size=0",
    "async_training.require_batches=1",
    "async_training.trigger_parameter_sync_step=1",
    "async_training.staleness_threshold=1.0",
    "async_training.partial_rollout=True",
    "rollout.total_rollout_steps=64",
]


# long: CI keeps the pools in test_rollout_pool and a loop on a pool fully async in test_own_agent_loop
@pytest.mark.parametrize(
    "mode",
    [
        pytest.param("sync", marks=pytest.mark.long),
        pytest.param("one_step_off_policy", marks=pytest.mark.long),
        pytest.param("fully_async_policy", marks=pytest.mark.long),
    ],
)
def test_the_tool_task_runs_on_a_rollout_pool_of_its_own(tmp_path, monkeypatch, mode):
    """The rollout workers run the loop, their samples' agent-loop fields and metrics travel to the trainer. Fully
    async, they also write a rollout trace of two prompts' samples a call to MLflow."""
    pool = ["actor_rollout_ref.hybrid_engine=False", "actor_rollout_ref.rollout.free_cache_engine=False"]
    sizes = ["rollout.nnodes=1", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"]
    extra = FULLY_ASYNC if mode == "fully_async_policy" else []
    if mode == "fully_async_policy":
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
        monkeypatch.chdir(tmp_path)  # the traces' spans go to ./mlruns of the run's working directory
        extra = [
            *extra,
            "actor_rollout_ref.rollout.trace.backend=mlflow",
            "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=2",
            "trainer.project_name=traced",
        ]
    rows = tool_task(
        tmp_path / "run",
        "actor_rollout_ref.rollout.name=hf",
        *pool,
        *sizes,
        f"trainer.async_mode={mode}",
        *extra,
        steps=4,
    )
    assert [m["training/global_step"] for m in rows] == [0, 1, 2, 3, 4]  # 0: validation before training
    assert all(m["tool_call_counts/max"] >= 1 and m["num_turns/max"] >= 4 for m in rows[1:])
    assert "val-aux/num_turns/mean" in rows[0] and "val-aux/num_turns/mean" in rows[-1]
    if mode == "fully_async_policy":
        print({k: [m[k] for m in rows[1:]] for k in ("fully_async/partial/partial_ratio", "critic/score/mean")})
        assert all(m["fully_async/count/updates"] == 1.0 for m in rows[1:])
        import mlflow

        mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlruns.db")
        exp = mlflow.get_experiment_by_name("traced")
        traces = mlflow.search_traces(experiment_ids=[exp.experiment_id], return_type="list")
        steps = {tr.info.tags["step"] for tr in traces if tr.info.tags["validate"] == "False"}
        assert steps and steps <= {"1", "2", "3", "4"} and any(tr.info.tags["validate"] == "True" for tr in traces)
        assert all(tr.data.spans[1].name == "ToolAgentLoop.run" for tr in traces)
