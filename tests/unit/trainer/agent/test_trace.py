"""Rollout traces (actor_rollout_ref.rollout.trace.*, verl's) written to a real MLflow store (sqlite, verl's default
kind) by the agent loop and read back: one trace per sample with verl's tags, the loop's run under it, and a span
per generation, tool-call parse and tool call, in order; token2text; the prompts max_samples_per_step_per_worker
picks, all n samples of each."""

import sys

import pytest

from rlrig.trainer import mlflow_store
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from tests.unit.trainer.agent.test_loop import EOS, TOK, Cfg, ScriptedEngine, calc_config, call, row

pytestmark = pytest.mark.process

__all__ = ["calc_config"]  # the fixture, used by name


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlruns.db")
    monkeypatch.chdir(tmp_path)  # the store's artifacts (the spans) go to ./mlruns, as MLflow's default puts them
    monkeypatch.setenv("MLFLOW_ENABLE_ASYNC_TRACE_LOGGING", "false")  # written before the test leaves tmp_path
    return tmp_path


def traced(calc_config, **trace_cfg) -> AgentRollout:
    cfg = Cfg(calc_config)
    t = cfg.actor_rollout_ref.rollout.trace
    t.backend, t.token2text = "mlflow", trace_cfg.get("token2text", False)
    t.max_samples_per_step_per_worker = trace_cfg.get("most")
    cfg.trainer.project_name = "traced"
    engine = ScriptedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}", "5*5=": f"#### 25{EOS}"})
    return AgentRollout(engine, TOK, cfg)


def read_back() -> list:
    import mlflow

    exp = mlflow.get_experiment_by_name("traced")
    got = mlflow.search_traces(experiment_ids=[exp.experiment_id], return_type="list")
    return sorted(got, key=lambda tr: (tr.info.tags["sample_index"], tr.info.tags["rollout_n"]))


def test_each_sample_is_one_trace_laid_out_as_verls(store, calc_config):
    agent = traced(calc_config)
    agent.tracer.at(7)
    agent.generate([row("12*3=", index=40), row("5*5=", index=41)], 2)  # verl's index: extra_info's
    got = read_back()
    assert [(tr.info.tags["sample_index"], tr.info.tags["rollout_n"]) for tr in got] == [
        ("40", "0"),
        ("40", "1"),
        ("41", "0"),
        ("41", "1"),
    ]
    assert all(tr.info.tags["step"] == "7" and tr.info.tags["validate"] == "False" for tr in got)
    tool_sample = [s.name for s in got[0].data.spans]
    assert tool_sample == [
        "agent_loop",
        "ToolAgentLoop.run",
        "generate",
        "extract_tool_calls",
        "CalculatorTool.execute",
        "generate",
        "extract_tool_calls",
    ]
    spans = {s.name: s for s in got[0].data.spans}
    assert spans["CalculatorTool.execute"].outputs["text"] == "36"
    assert spans["ToolAgentLoop.run"].inputs["raw_prompt"] == [{"role": "user", "content": "12*3="}]
    assert spans["ToolAgentLoop.run"].outputs["num_turns"] == 4
    root = spans["agent_loop"]
    assert all(root.start_time_ns <= s.start_time_ns <= s.end_time_ns <= root.end_time_ns for s in got[0].data.spans)
    assert [s.name for s in got[2].data.spans][2:] == ["generate", "extract_tool_calls"]  # no call: no tool span


def test_token2text_puts_the_text_beside_the_ids_and_validation_is_tagged(store, calc_config):
    agent = traced(calc_config, token2text=True)
    agent.tracer.at(3, validate=True)
    agent.generate([row("5*5=")], 1)
    (tr,) = read_back()
    assert tr.info.tags["validate"] == "True"
    gen = next(s for s in tr.data.spans if s.name == "generate")
    assert gen.outputs["text"] == f"#### 25{EOS}" and gen.inputs["text"].endswith("5*5=")


@pytest.mark.parametrize("most, prompts_traced", [(None, 3), (1, 1), (0, 0), (5, 3)])
def test_max_samples_traces_all_n_of_that_many_prompts(store, calc_config, most, prompts_traced):
    agent = traced(calc_config, most=most)
    agent.generate([row("5*5="), row("5*5="), row("5*5=")], 2)
    got = read_back() if prompts_traced else []
    assert len(got) == 2 * prompts_traced
    if prompts_traced:
        assert len({tr.info.tags["sample_index"] for tr in got}) == prompts_traced


def test_no_backend_writes_nothing(store, calc_config):
    cfg = Cfg(calc_config)
    agent = AgentRollout(ScriptedEngine({"5*5=": f"#### 25{EOS}"}), TOK, cfg)
    ro, stats = agent.generate([row("5*5=")], 1)
    assert agent.loop.tracer is None and stats.trajs[0].trace is None
    assert not (store / "mlruns.db").exists()


@pytest.mark.parametrize(
    "override, says",
    [
        ("actor_rollout_ref.rollout.trace.backend=weave", "Weave traces are not in rlrig"),
        ("actor_rollout_ref.rollout.trace.backend=jaeger", "choose mlflow (or null)"),
        ("actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker=-1", "0 or more"),
    ],
)
def test_what_rlrig_cannot_trace_is_refused_in_one_line(override, says):
    with pytest.raises(ConfigError) as e:
        parse_overrides([override])
    assert says in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides, named",
    [
        (["actor_rollout_ref.rollout.trace.backend=mlflow"], "actor_rollout_ref.rollout.trace.backend=mlflow"),
        (["trainer.logger=[console,mlflow]"], "trainer.logger=mlflow"),
        ([], None),
    ],
)
def test_mlflow_missing_is_named_at_start(monkeypatch, overrides, named):
    cfg = parse_overrides(overrides)
    mlflow_store.require(cfg)  # installed here
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if it were not
    if named is None:
        mlflow_store.require(cfg)
        return
    with pytest.raises(ConfigError, match=r"MLflow is not installed; pip install 'rlrig\[mlflow\]'") as e:
        mlflow_store.require(cfg)
    assert str(e.value).startswith(named)
