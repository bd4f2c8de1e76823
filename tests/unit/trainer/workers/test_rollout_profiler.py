"""verl 0.9's rollout profiler (actor_rollout_ref.rollout.profiler): its settings as verl resolves them, the replicas
it chooses, the arguments each engine's own profiler gets, how it shares a worker with that worker's own profiler,
and real traces from a CPU run with the hf engine (about 15 s)."""

import gzip
import json
from pathlib import Path

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.profiler_settings import rollout_profile
from rlrig.trainer.rollout.engines.recording import EngineRecording
from rlrig.trainer.workers import profiling
from rlrig.trainer.workers.profiling import WorkerProfiler
from rlrig.trainer.workers.rollout_profiling import RolloutRecorder, engine_recording

pytestmark = pytest.mark.process

MODEL = "actor_rollout_ref.model.path=/m"
ON = [
    "global_profiler.tool=torch",
    "global_profiler.steps=[1,2]",
    "global_profiler.save_path=/p",
    "actor_rollout_ref.rollout.profiler.enable=True",
    "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
]
SCRIPT = "profile/run_qwen2_5_7b_torch_profile"
SCRIPTS = Path(__file__).parents[1] / "config" / "verl_scripts" / "overrides_0.9.0.json"


def cfg(*more):
    return parse_overrides([MODEL, *more])


# --- the settings ---


def test_its_nulls_follow_the_actors_profiler_and_global_profiler_as_verls_defaults_do():
    c = cfg(
        "global_profiler.tool=torch",
        "global_profiler.save_path=/g",
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.ranks=[2]",
        "actor_rollout_ref.actor.profiler.save_path=/actor",  # not the rollout's: verl's is global_profiler's
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,stack]",
    )
    p = rollout_profile(c)
    assert (p.enable, p.tool, p.ranks, p.save_path, p.discrete, p.contents) == (
        True,
        "torch",
        (2,),
        "/g",
        True,
        ("cpu", "stack"),
    )
    assert p.records
    # the actor's window mode: verl's engines record nothing (_should_profile asks for discrete)
    assert not rollout_profile(
        cfg("global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True")
    ).records


def test_verls_own_interpolations_are_taken_as_following():
    c = cfg(
        *ON[:3],
        "actor_rollout_ref.actor.profiler.enable=True",
        "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.profiler.tool=${oc.select:global_profiler.tool,null}",
        "actor_rollout_ref.rollout.profiler.enable=${oc.select:actor_rollout_ref.actor.profiler.enable,false}",
        "actor_rollout_ref.rollout.profiler.ranks=${oc.select:actor_rollout_ref.actor.profiler.ranks,[]}",
        "actor_rollout_ref.rollout.profiler.save_path=${oc.select:global_profiler.save_path,null}",
    )
    assert rollout_profile(c).records and rollout_profile(c).save_path == "/p"


def test_verls_example_script_is_taken_with_its_rollout_settings():
    overrides = json.loads(SCRIPTS.read_text())["scripts"][SCRIPT]["overrides"]
    c = parse_overrides(overrides)
    p = rollout_profile(c)
    assert (p.enable, p.tool, p.discrete, p.ranks, p.contents) == (True, "torch", True, (0,), ("cpu", "cuda"))
    assert (p.token_start, p.token_end) == (None, None)
    assert not c.actor_rollout_ref.actor.profiler.tool_config.torch.discrete  # the actor records windows


# --- the replicas it chooses ---


@pytest.mark.parametrize(
    "more,tp,chosen",
    [
        ([], 1, [0]),  # no ranks: the replica of rank 0
        (["actor_rollout_ref.rollout.profiler.ranks=[1,3]"], 1, [1, 3]),
        (["actor_rollout_ref.rollout.profiler.ranks=[0,3]"], 2, [0, 1, 2, 3]),  # rank 3's replica is workers 2 and 3
        (["actor_rollout_ref.rollout.profiler.all_ranks=True"], 1, [0, 1, 2, 3]),
    ],
)
def test_every_worker_of_a_chosen_replica_records(more, tp, chosen):
    c = cfg(*ON, *more, "trainer.n_gpus_per_node=4")
    c.actor_rollout_ref.rollout.tensor_model_parallel_size = tp  # hf's is 1; the choice is the engines' alike
    assert [r for r in range(4) if engine_recording(c, r) is not None] == chosen
    assert engine_recording(c, chosen[-1]).folder == f"/p/agent_loop_rollout_replica_{chosen[-1] // tp}"


@pytest.mark.parametrize(
    "more",
    [
        ["global_profiler.steps=null"],
        ["actor_rollout_ref.rollout.profiler.enable=False"],
    ],
)
def test_no_steps_or_not_enabled_records_nothing(more):
    assert engine_recording(cfg(*ON, *more), 0) is None


# --- each engine's arguments, as verl converts them (config.py build_vllm_profiler_args, build_sglang_profiler_args)


def test_vllm_and_sglang_get_verls_arguments():
    rec = EngineRecording("/p/agent_loop_rollout_replica_0", 0, ("cpu", "shapes", "stack"), 3, 10)
    v = rec.vllm_config()
    assert (v["profiler"], v["torch_profiler_dir"], v["delay_iterations"], v["max_iterations"]) == (
        "torch",
        "/p/agent_loop_rollout_replica_0",
        3,
        7,
    )
    assert (v["torch_profiler_with_stack"], v["torch_profiler_record_shapes"], v["torch_profiler_with_memory"]) == (
        True,
        True,
        False,
    )
    assert v["ignore_frontend"] is True
    s = rec.sglang_args()
    assert (s["output_dir"], s["start_step"], s["num_steps"], s["with_stack"]) == (rec.folder, 3, 7, True)
    whole = EngineRecording("/p/x", 0)
    assert (whole.vllm_config()["delay_iterations"], whole.vllm_config()["max_iterations"]) == (0, 0)
    assert (whole.sglang_args()["start_step"], whole.sglang_args()["num_steps"]) == (None, None)


def test_sglang_is_started_by_the_worker_that_talks_to_it_and_may_have_stopped_by_itself():
    from rlrig.trainer.rollout.engines.sglang_engine import SGLangRollout

    calls = []

    class Engine:  # SGLang's Engine, as 0.5.16 to 0.5.23 answer a stop after num_steps stopped it
        def start_profile(self, **kw):
            calls.append(kw)

        def stop_profile(self):
            raise RuntimeError("Profiling is not in progress")

    e = object.__new__(SGLangRollout)  # no engine started: only the profiler's calls
    e.engine, e.leads, e.recording = Engine(), True, EngineRecording("/p/r0", 0, ("shapes",), 1, 4)
    e.start_profile("step1")
    e.stop_profile()  # it stopped after its 3 steps
    assert calls == [
        {"output_dir": "/p/r0", "with_stack": False, "record_shapes": True, "start_step": 1, "num_steps": 3}
    ]
    e.recording = EngineRecording("/p/r0", 0)
    with pytest.raises(RuntimeError, match="not in progress"):  # no window: SGLang was still recording
        e.stop_profile()
    e.leads = False  # another member of the group: SGLang is its lead's
    e.start_profile("step1")
    e.stop_profile()
    assert len(calls) == 1


# --- sharing a worker with its own profiler ---


class FakeTool(profiling.Tool):
    def __init__(self, log):
        self.log = log

    def begin(self, profile, folder, stem):
        self.log.append(("begin", folder, stem))

    def end(self):
        self.log.append(("end",))


class FakeEngine:
    def __init__(self, log):
        self.log = log

    def start_profile(self, name):
        self.log.append(("engine start", name))

    def stop_profile(self):
        self.log.append(("engine stop",))


def worker(discrete: bool, log: list) -> WorkerProfiler:
    c = cfg(
        "global_profiler.tool=torch",
        "actor_rollout_ref.actor.profiler.enable=True",
        f"actor_rollout_ref.actor.profiler.tool_config.torch.discrete={discrete}",
    )
    actor = profiling.role_profile(c, "actor")
    return WorkerProfiler(FakeTool(log), 0, {"actor": actor}, "e2e", RolloutRecorder(FakeEngine(log)))


def steps(wp: WorkerProfiler, plan: list[tuple[int, list[str], bool]]) -> None:
    for step, phases, stop in plan:
        wp.start(step)
        for name in phases:
            with wp.phase(name):
                pass
        if stop:
            wp.stop()


def test_the_window_opens_after_the_generation_the_engine_records():
    log = []
    steps(worker(False, log), [(1, ["gen", "reward", "update_actor"], True), (2, ["gen", "gen_max", "reward"], True)])
    assert log == [
        ("engine start", "step1"),
        ("engine stop",),
        ("begin", "e2e", "step1"),
        ("end",),
        ("engine start", "step2"),
        ("engine stop",),
        ("engine start", "step2_call2"),  # ReMax's greedy generation
        ("engine stop",),
        ("begin", "e2e", "step2"),
        ("end",),
    ]


def test_a_window_over_several_steps_closes_at_each_generation_and_reopens_named_after_its_step():
    log = []
    steps(worker(False, log), [(2, ["gen", "reward"], False), (3, ["gen", "reward"], True)])
    assert log == [
        ("engine start", "step2"),
        ("engine stop",),
        ("begin", "e2e", "step2"),
        ("end",),
        ("engine start", "step3"),
        ("engine stop",),
        ("begin", "e2e", "step3"),
        ("end",),
    ]


def test_in_discrete_mode_the_worker_records_its_other_phases_and_the_engine_the_generation():
    log = []
    steps(worker(True, log), [(4, ["gen", "old_log_prob", "update_actor"], True)])
    assert log == [
        ("engine start", "step4"),
        ("engine stop",),
        ("begin", "actor_compute_log_prob", "step4"),
        ("end",),
        ("begin", "actor_update", "step4"),
        ("end",),
    ]


# --- real traces from a CPU run (hf) ---

FAST = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.device=cpu",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8"]  # fmt: skip


def events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_cpu_run_records_the_generation_of_the_named_steps_beside_the_actors_windows(tmp_path):
    from rlrig.trainer.driver.single_process import run_steps

    run_steps(
        [
            *FAST,
            "global_profiler.tool=torch",
            "global_profiler.steps=[1,3]",
            f"global_profiler.save_path={tmp_path}",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.rollout.profiler.enable=True",
            "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
            "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[cpu,shapes]",
        ],
        3,
    )
    gen = [
        "agent_loop_rollout_replica_0/step1_prof_rank-0.json.gz",
        "agent_loop_rollout_replica_0/step3_prof_rank-0.json.gz",
    ]
    # the actor's windows are the files they are without the rollout profiler
    assert files(tmp_path) == sorted([*gen, "e2e/step1_prof_rank-0.json.gz", "e2e/step3_prof_rank-0.json.gz"])
    for f in gen:
        ev = events(tmp_path / f)
        assert sum(e.get("cat") == "cpu_op" for e in ev) > 100  # transformers' generate, op by op
        assert any("Input Dims" in e.get("args", {}) for e in ev)  # its own contents: shapes
    for step in (1, 3):
        marks = {
            e["name"]
            for e in events(tmp_path / f"e2e/step{step}_prof_rank-0.json.gz")
            if e.get("cat") == "user_annotation"
        }
        assert {"reward", "update_actor", "update_weights"} <= marks and "gen" not in marks
