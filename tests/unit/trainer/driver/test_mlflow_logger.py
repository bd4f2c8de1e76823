"""trainer.logger=mlflow, as verl's: a run named trainer.experiment_name in the project's experiment, the config as
its parameters (nested keys joined by /), each step's metrics under the names MLflow takes. Against a real MLflow
store (sqlite, verl's default kind)."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver.reporting import MetricsLog, flat, mlflow_key

pytestmark = pytest.mark.process


@pytest.mark.parametrize(
    "key, logged",
    [
        ("critic/score/mean", "critic/score/mean"),
        ("val-core/gsm8k/reward/mean@4", "val-core/gsm8k/reward/mean_at_4"),
        ("a//b", "a/b"),
        ("timing_s/agent_loop/tool_calls/max", "timing_s/agent_loop/tool_calls/max"),
        ("odd(key)", "odd_key_"),
    ],
)
def test_metric_names_become_what_mlflow_takes(key, logged):
    assert mlflow_key(key) == logged


def test_the_config_flattens_as_verls_parameters():
    assert flat({"a": {"b": 1, "c": [5, {"d": 2}]}, "e": None}) == {
        "a/b": 1,
        "a/c/list_len": 2,
        "a/c/0": 5,
        "a/c/1/d": 2,
        "e": None,
    }


def test_a_run_gets_the_config_and_every_steps_metrics(tmp_path, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    monkeypatch.chdir(tmp_path)  # the run's artifacts go to ./mlruns, as MLflow's default puts them
    cfg = parse_overrides(
        ["trainer.logger=[console,mlflow]", "trainer.project_name=proj", "trainer.experiment_name=exp1"]
    )
    log = MetricsLog(cfg, tmp_path / "metrics.jsonl")
    try:
        for step in (1, 2):
            log.log(step, {"critic/score/mean": 0.1 * step, "val-core/a/reward/mean@1": 0.5})
    finally:
        mlflow.end_run()
    (run,) = mlflow.search_runs(experiment_names=["proj"], output_format="list")
    assert run.info.run_name == "exp1"
    assert run.data.params["trainer/experiment_name"] == "exp1" and run.data.params["data/train_batch_size"] == "1024"
    history = mlflow.MlflowClient().get_metric_history(run.info.run_id, "critic/score/mean")
    assert [(m.step, round(m.value, 6)) for m in history] == [(1, 0.1), (2, 0.2)]
    assert run.data.metrics["val-core/a/reward/mean_at_1"] == 0.5
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 2


def test_validation_samples_are_attached_as_verls_artifact(tmp_path, monkeypatch):
    import json

    import mlflow

    from rlrig.trainer.driver.validation import mlflow_generations

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    monkeypatch.chdir(tmp_path)  # the run's artifacts go to ./mlruns, as MLflow's default puts them
    cfg = parse_overrides(["trainer.logger=[mlflow]", "trainer.project_name=proj"])
    MetricsLog(cfg, tmp_path / "metrics.jsonl")
    try:
        shown = [
            {
                "step": 3,
                "data_source": "a",
                "prompt": [{"role": "user", "content": "1+1="}],
                "response": "2",
                "score": 1.0,
            }
        ]
        mlflow_generations(shown, 3)
        run_id = mlflow.active_run().info.run_id
    finally:
        mlflow.end_run()
    local = mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path="val_step3.json", dst_path=str(tmp_path))
    assert json.loads(open(local).read()) == [
        {"input": [{"role": "user", "content": "1+1="}], "output": "2", "score": 1.0}
    ]


@pytest.mark.parametrize("where", ["root", "path"])
def test_verls_file_logger_writes_a_json_line_a_step(tmp_path, monkeypatch, where):
    """trainer.logger=file, as verl's FileLogger: {"step", "data"} a line, in VERL_FILE_LOGGER_PATH, else
    VERL_FILE_LOGGER_ROOT/<project_name>/<experiment_name>.jsonl."""
    import json

    if where == "path":
        monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "mine.jsonl"))
        want = tmp_path / "mine.jsonl"
    else:
        monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
        want = tmp_path / "proj" / "exp.jsonl"
    cfg = parse_overrides(["trainer.logger=[console,file]", "trainer.project_name=proj", "trainer.experiment_name=exp"])
    log = MetricsLog(cfg, tmp_path / "metrics.jsonl")
    log.log(1, {"critic/score/mean": 0.5})
    log.log(2, {"critic/score/mean": 0.75})
    lines = [json.loads(x) for x in want.read_text().splitlines()]  # written unbuffered: readable at once
    assert lines == [{"step": 1, "data": {"critic/score/mean": 0.5}}, {"step": 2, "data": {"critic/score/mean": 0.75}}]
