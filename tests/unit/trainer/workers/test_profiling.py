"""verl's profilers (global_profiler.*, each role's profiler.*): the keys, which steps and ranks record, what a worker's
profiler does with its phases, the Nsight options Ray gets, and real torch traces from a CPU run."""

import contextlib
import gzip
import json
import os
from pathlib import Path

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.config.validation import profiler_device_refusal
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.profiler_settings import RoleProfile, role_profile
from rlrig.trainer.workers import profiling
from rlrig.trainer.workers.profiling import StepWindows, WorkerProfiler

pytestmark = pytest.mark.process

MODEL = "actor_rollout_ref.model.path=/m"
SCRIPTS = Path(__file__).parents[1] / "config" / "verl_scripts" / "overrides.json"
NSYS_SCRIPT = "ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys"


# --- the keys ---


def test_verls_nsys_example_parses_unchanged_with_its_settings():
    cfg = parse_overrides(json.loads(SCRIPTS.read_text())["scripts"][NSYS_SCRIPT]["overrides"])
    g, actor, critic = cfg.global_profiler, role_profile(cfg, "actor"), role_profile(cfg, "critic")
    assert (g.tool, g.steps, g.profile_continuous_steps) == ("nsys", [1, 2, 5], True)
    assert actor.discrete and critic.discrete  # global_tool_config.nsys.discrete=True, which the roles follow
    assert [r for r in range(8) if actor.chooses(r)] == [0, 4] == [r for r in range(8) if critic.chooses(r)]
    assert profiling.nsight_runtime_env(cfg)["runtime_env"]["nsight"]["capture-range-end"] == "repeat-shutdown:18"


def test_a_roles_nulls_follow_global_profiler():
    cfg = parse_overrides(
        [
            MODEL,
            "global_profiler.tool=torch",
            "global_profiler.save_path=/p",
            "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=7",
            "critic.profiler.save_path=/c",
            "critic.profiler.tool_config.torch_memory.stack_depth=3",
        ]
    )
    actor, critic = role_profile(cfg, "actor"), role_profile(cfg, "critic")
    assert (actor.save_path, actor.max_entries, actor.stack_depth) == ("/p", 7, 32)
    assert (critic.save_path, critic.max_entries, critic.stack_depth) == ("/c", 7, 3)


def test_the_reward_models_tool_config_is_the_actors():
    cfg = parse_overrides(
        [MODEL, "global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True"]
    )
    assert role_profile(cfg, "reward_model").discrete


@pytest.mark.parametrize(
    "overrides,words",
    [
        (["global_profiler.tool=npu"], "Ascend NPU profiling is not in rlrig"),
        (["global_profiler.tool=perf"], "choose one of torch, nsys, torch_memory"),
        (["global_profiler.tool=torch", "global_profiler.steps=[0,1]"], "counting from 1"),
        (["global_profiler.tool=nsys", "actor_rollout_ref.actor.profiler.tool=torch"], "one profiler tool per run"),
        (["actor_rollout_ref.actor.profiler.ranks=[-1]"], "counting from 0"),
        (["actor_rollout_ref.actor.profiler.tool_config.torch.contents=[gpu]"], "'gpu' is not one of cuda, cpu"),
        (["critic.profiler.tool_config.npu.level=level1"], "Ascend NPU profiling is not in rlrig"),
        (["actor_rollout_ref.rollout.profiler.enable=True"], "record with torch.profiler only"),
        (["global_profiler.tool=nsys", "actor_rollout_ref.rollout.profiler.enable=True"], "set global_profiler.tool"),
        (["global_profiler.tool=torch", "actor_rollout_ref.rollout.profiler.enable=True"], "(discrete mode) only"),
        (["global_profiler.tool=torch", "actor_rollout_ref.rollout.profiler.tool=nsys"], "one profiler tool per run"),
        (["actor_rollout_ref.rollout.profiler.ranks=[-1]"], "give a list of worker ranks"),
        (["actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[gpu]"], "'gpu' is not one of cuda"),
        (["actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=0"], "above profile_token_start"),
        (["actor_rollout_ref.rollout.profiler.tool_config.npu.level=level1"], "Ascend NPU profiling is not in rlrig"),
        (
            [
                "global_profiler.tool=torch",
                "actor_rollout_ref.rollout.profiler.enable=True",
                "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
                "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_start=2",
            ],
            "the hf engine records the whole gen phase",
        ),
        (["global_profiler.global_tool_config.nsys.controller_nsight_options.trace=cuda"], "`nsys profile` yourself"),
        (["reward_model.profiler.tool_config.torch.discrete=True"], "takes the actor's tool_config"),
        (["global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=0"], "must be at least 1"),
        (["trainer.device=cpu", "global_profiler.tool=nsys"], "global_profiler.tool=nsys records CUDA work"),
        (["trainer.device=cpu", "global_profiler.tool=torch_memory"], "this run is on CPU (trainer.device=cpu)"),
        (
            [
                "global_profiler.tool=torch",
                "actor_rollout_ref.actor.profiler.enable=True",
                "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
                "critic.profiler.enable=True",  # gae: the critic shares the training workers
            ],
            "give their tool_config.torch.discrete one value",
        ),
    ],
)
def test_what_rlrig_does_not_do_is_refused_in_one_line_naming_the_key(overrides, words):
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, *overrides])
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "overrides",
    [
        # verl's defaults, as its own config spells them
        ["actor_rollout_ref.rollout.profiler.save_path=outputs/profile", "reward_model.profiler.tool_config=null"],
        [
            "actor_rollout_ref.actor.profiler.tool_config.npu.contents=[]",
            "critic.profiler.tool_config.npu.level=level0",
        ],
        ["global_profiler.global_tool_config.torch_memory.context=alloc"],  # verl reads it nowhere
        # a critic in a pool of its own has a profiler of its own, so its mode may differ
        [
            "global_profiler.tool=torch",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
            "critic.profiler.enable=True",
            "critic.enable_resource_pool=True",
            "critic.nnodes=1",
            "critic.n_gpus_per_node=1",
        ],
        ["trainer.device=cpu", "global_profiler.tool=torch", "global_profiler.steps=[1]"],
    ],
)
def test_accepted(overrides):
    parse_overrides([MODEL, *overrides])


def test_a_cuda_tool_is_refused_once_auto_resolves_to_cpu():
    cfg = parse_overrides([MODEL, "global_profiler.tool=torch_memory"])  # trainer.device=auto
    assert profiler_device_refusal(cfg) is None
    cfg.trainer.device = "cpu"  # what the driver's with_runtime sets on a cluster without GPUs
    assert "torch_memory records CUDA work" in profiler_device_refusal(cfg)


# --- which steps and ranks record ---


@pytest.mark.parametrize(
    "steps,continuous,starts,stops",
    [
        ([1, 2, 5], False, [1, 2, 5], [1, 2, 5]),  # verl: [1] in one, [2] in another, [5] in another
        ([1, 2, 5], True, [1, 2, 5], [2, 5]),  # verl: [1,2] in one, [5] in another
        ([2, 3, 4], True, [2, 3, 4], [4]),
        ([6], True, [6], [6]),
        (None, False, [], []),
    ],
)
def test_windows_of_steps(steps, continuous, starts, stops):
    w = StepWindows(frozenset(steps or ()), continuous)
    assert [s for s in range(1, 8) if w.starts(s)] == starts
    assert [s for s in range(1, 8) if w.stops(s)] == stops


def test_no_tool_records_no_steps_and_a_run_ending_in_a_window_closes_it():
    cfg = parse_overrides([MODEL, "global_profiler.steps=[1,2]"])
    assert not StepWindows.of(cfg).starts(1)
    w = StepWindows(frozenset({4, 5, 6}), True)
    assert w.left_open(5) and not w.left_open(6) and not w.left_open(3)


def profile(enable=True, all_ranks=False, ranks=(), discrete=False):
    return RoleProfile(enable, all_ranks, tuple(ranks), "/p", discrete, (), 100, 32)


@pytest.mark.parametrize(
    "enable,all_ranks,ranks,chosen",
    [
        (True, False, (), [0]),  # verl's default: rank 0
        (True, False, (0, 4), [0, 4]),
        (True, True, (1,), list(range(6))),
        (False, True, (0, 4), []),  # not enabled: no rank
    ],
)
def test_the_ranks_a_role_chooses(enable, all_ranks, ranks, chosen):
    p = profile(enable, all_ranks, ranks)
    assert [r for r in range(6) if p.chooses(r)] == chosen


# --- a worker's profiler ---


class FakeTool(profiling.Tool):
    def __init__(self):
        self.log = []

    def begin(self, profile, folder, stem):
        self.log.append(("begin", folder, stem))

    def end(self):
        self.log.append(("end",))

    def mark(self, name):
        self.log.append(("mark", name))
        return contextlib.nullcontext()


def run(wp: WorkerProfiler, step: int, phases: list[str], stop: bool) -> None:
    wp.start(step)
    for name in phases:
        with wp.phase(name):
            pass
    if stop:
        wp.stop()


def test_a_window_records_every_phase_from_its_first_step_to_its_last():
    tool = FakeTool()
    wp = WorkerProfiler(tool, 0, {"actor": profile(), "critic": profile(enable=False)}, "e2e")
    run(wp, 2, ["gen", "values"], stop=False)
    run(wp, 3, ["gen"], stop=True)
    with wp.phase("gen"):  # after the window: nothing
        pass
    assert tool.log == [("begin", "e2e", "step2"), ("mark", "gen"), ("mark", "values"), ("mark", "gen"), ("end",)]


def test_a_colocated_role_that_chooses_the_rank_records_the_whole_process():
    tool = FakeTool()  # verl: the critic's start_profile starts the process's one torch profiler
    wp = WorkerProfiler(tool, 4, {"actor": profile(), "critic": profile(ranks=(4,))}, "e2e")
    run(wp, 1, [], stop=True)
    assert tool.log == [("begin", "e2e", "step1"), ("end",)]
    tool = FakeTool()
    wp = WorkerProfiler(tool, 3, {"actor": profile(), "critic": profile(ranks=(4,))}, "e2e")
    run(wp, 1, ["gen"], stop=True)
    assert tool.log == []


def test_discrete_mode_records_each_phase_of_a_role_that_chooses_the_rank_in_verls_folder():
    tool = FakeTool()
    roles = {"actor": profile(ranks=(1,), discrete=True), "critic": profile(ranks=(0,), discrete=True)}
    wp = WorkerProfiler(tool, 1, roles, "e2e")
    run(wp, 5, ["gen", "values", "adv", "update_actor", "update_actor"], stop=True)
    assert tool.log == [
        ("begin", "rollout_generate", "step5"),
        ("mark", "gen"),
        ("end",),
        ("begin", "actor_update", "step5"),
        ("mark", "update_actor"),
        ("end",),
        ("begin", "actor_update", "step5_call2"),  # a phase run twice in a step (a pool worker's several callers)
        ("mark", "update_actor"),
        ("end",),
    ]


def test_without_a_tool_a_worker_records_nothing():
    assert profiling.OFF.window is None
    run(profiling.OFF, 1, ["gen"], stop=True)


def test_nsys_captures_each_phase_in_discrete_mode_and_marks_it_with_nvtx(monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("cudaProfilerStart"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("cudaProfilerStop"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda msg: calls.append(f"push {msg}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    tool = profiling.TOOLS["nsys"](0, torch.device("cuda", 0), profile())
    wp = WorkerProfiler(tool, 0, {"actor": profile(discrete=True)}, "e2e")
    run(wp, 1, ["gen", "adv"], stop=True)
    assert calls == ["cudaProfilerStart", "push gen", "pop", "cudaProfilerStop"]
    calls.clear()
    wp = WorkerProfiler(tool, 0, {"actor": profile()}, "e2e")  # continuous: one capture, every phase a range
    run(wp, 1, ["gen", "adv"], stop=True)
    assert calls == ["cudaProfilerStart", "push gen", "pop", "push adv", "pop", "cudaProfilerStop"]


def test_torch_memory_records_from_the_start_and_dumps_where_verl_does(monkeypatch, tmp_path):
    import torch

    recorded, dumped = [], []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: recorded.append(kw))
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: dumped.append(path))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    p = RoleProfile(True, False, (), str(tmp_path), False, (), 5000, 8)
    tool = profiling.TOOLS["torch_memory"](2, torch.device("cuda", 0), p)
    assert recorded == [{"context": "all", "stacks": "all", "max_entries": 5000}]  # torch 2.x takes no stack_depth
    wp = WorkerProfiler(tool, 2, {"actor": RoleProfile(True, True, (), str(tmp_path), True, (), 5000, 8)}, "e2e")
    run(wp, 3, ["gen"], stop=False)  # no discrete mode: a window from step 3
    run(wp, 4, ["gen"], stop=True)
    wp.after_update(4)
    pid = os.getpid()
    assert dumped == [
        str(tmp_path / "step3" / f"torch_memory_rank2_pid{pid}.pickle"),
        str(tmp_path / "step4" / f"post_update_step4_rank2_pid{pid}.pickle"),
    ]


# --- Nsight Systems: Ray's runtime_env for the workers ---


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (["global_profiler.tool=torch", "global_profiler.steps=[1]"], {}),
        (["global_profiler.tool=nsys"], {}),  # no steps: verl adds no runtime_env either
        (
            ["global_profiler.tool=nsys", "global_profiler.steps=[1,3]"],
            {
                "trace": "cuda,nvtx,cublas,ucx",
                "cuda-memory-usage": "true",
                "cuda-graph-trace": "graph",
                "capture-range": "cudaProfilerApi",
                "capture-range-end": "repeat-shutdown:12",
                "kill": "none",
            },
        ),
        (
            [
                "global_profiler.tool=nsys",
                "global_profiler.steps=[1]",
                "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end=repeat-shutdown:2",
                "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage=false",
                "+global_profiler.global_tool_config.nsys.worker_nsight_options.o=report_%p",
                "global_profiler.global_tool_config.nsys.worker_nsight_options.kill=null",
            ],
            {
                "trace": "cuda,nvtx,cublas,ucx",
                "cuda-memory-usage": "false",
                "cuda-graph-trace": "graph",
                "capture-range": "cudaProfilerApi",
                "capture-range-end": "repeat-shutdown:2",
                "o": "report_%p",
            },
        ),
    ],
)
def test_nsight_options_for_rays_runtime_env(overrides, expected):
    env = profiling.nsight_runtime_env(parse_overrides([MODEL, *overrides]))
    assert env == ({"runtime_env": {"nsight": expected}} if expected else {})


def test_rays_nsight_plugin_turns_the_options_into_nsys_profile_flags():
    from ray._private.runtime_env.nsight import parse_nsight_config

    cfg = parse_overrides([MODEL, "global_profiler.tool=nsys", "global_profiler.steps=[2]"])
    cmd = parse_nsight_config(profiling.nsight_runtime_env(cfg)["runtime_env"]["nsight"])
    assert cmd[:2] == ["nsys", "profile"]
    assert "--capture-range=cudaProfilerApi" in cmd and "--capture-range-end=repeat-shutdown:6" in cmd


# --- real traces from a CPU run ---

FAST = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.device=cpu",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8"]  # fmt: skip


def trace_events(path: Path) -> list[dict]:
    with gzip.open(path) as f:
        return json.load(f)["traceEvents"]


def annotations(path: Path) -> set[str]:
    return {e["name"] for e in trace_events(path) if e.get("cat") == "user_annotation"}


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_a_cpu_run_writes_a_chrome_trace_for_each_chosen_step(tmp_path):
    from rlrig.trainer.driver.single_process import run_steps

    run_steps(
        [
            *FAST,
            "global_profiler.tool=torch",
            "global_profiler.steps=[1,3]",
            f"global_profiler.save_path={tmp_path}",
            "actor_rollout_ref.actor.profiler.enable=True",
        ],
        3,
    )
    assert files(tmp_path) == ["e2e/step1_prof_rank-0.json.gz", "e2e/step3_prof_rank-0.json.gz"]
    for f in files(tmp_path):
        assert {"gen", "reward", "update_actor", "update_weights"} <= annotations(tmp_path / f)
        assert any(e.get("cat") == "cpu_op" for e in trace_events(tmp_path / f))


# the rollout's profiler follows the actor's (verl's defaults), so in discrete mode the engine records the generation
# in its replica's folder, as verl 0.9's engines do; turned off, the training worker records it as its own phase
@pytest.mark.parametrize(
    "rollout,gen_trace",
    [
        ([], "agent_loop_rollout_replica_0/step2_prof_rank-0.json.gz"),
        (["actor_rollout_ref.rollout.profiler.enable=False"], "rollout_generate/step2_prof_rank-0.json.gz"),
    ],
)
def test_a_cpu_run_in_discrete_mode_writes_a_trace_per_phase_in_verls_folders(tmp_path, rollout, gen_trace):
    from rlrig.trainer.driver.single_process import run_steps

    run_steps(
        [
            *FAST,
            "global_profiler.tool=torch",
            "global_profiler.steps=[2]",
            f"global_profiler.save_path={tmp_path}",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
            "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cpu,shapes]",
            *rollout,
        ],
        2,
    )
    assert files(tmp_path) == sorted(
        ["actor_compute_log_prob/step2_prof_rank-0.json.gz", "actor_update/step2_prof_rank-0.json.gz", gen_trace]
    )
    assert annotations(tmp_path / "actor_update/step2_prof_rank-0.json.gz") >= {"update_actor"}
    assert any("Input Dims" in e.get("args", {}) for e in trace_events(tmp_path / gen_trace))
    assert any(e.get("name") == "aten::mm" or e.get("cat") == "cpu_op" for e in trace_events(tmp_path / gen_trace))


def test_a_rank_the_role_does_not_choose_writes_nothing(tmp_path):
    from rlrig.trainer.driver.single_process import run_steps

    run_steps(
        [
            *FAST,
            "global_profiler.tool=torch",
            "global_profiler.steps=[1]",
            f"global_profiler.save_path={tmp_path}",
            "actor_rollout_ref.actor.profiler.enable=True",
            "actor_rollout_ref.actor.profiler.ranks=[1]",
        ],
        1,
    )
    assert files(tmp_path) == []
