"""verl's multi-turn examples (examples/sglang_multiturn, FSDP; the scripts of verl_scripts/overrides.json whose scope
is multi-turn/agent) with the config files they name (verl_config_files/, copied from the same commit): accepted
unchanged, or refused in one line for a reason listed here. Their tool and interaction configs load."""

import json
import sys
import types
from pathlib import Path

import pytest
import torch.utils.data

from rlrig.trainer.agent import setup
from rlrig.trainer.agent.interactions import load_interactions
from rlrig.trainer.agent.tools import load_tools
from rlrig.trainer.config.config_files import assemble
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.data.custom_sampler import make_sampler
from rlrig.trainer.errors import ConfigError

HERE = Path(__file__).parent
VERL_FILES = HERE / "verl_config_files"
SCRIPTS = json.loads((HERE / "verl_scripts" / "overrides.json").read_text())["scripts"]
MULTI_TURN = sorted(n for n, s in SCRIPTS.items() if s["scope"].startswith("multi-turn/agent"))

VERL_SAMPLERS = "tests.utils.dataset.test_create_rl_sampler_on_cpu"

EXPECTED = {
    "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn": "accepted",
    "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu": "accepted",
    "sglang_multiturn/run_qwen3-4b_gsm8k_multiturn": "accepted",
    "sglang_multiturn/search_r1_like/run_qwen2.5-3b_instruct_search_multiturn": "accepted",
    "sglang_multiturn/run_qwen2.5-0.5b_gsm8k_multiturn_w_interaction": "accepted",
    # the retool recipe's data set class (data.custom_cls): a verl submodule, which needs verl installed to load
    "sglang_multiturn/run_qwen3_4b_dapo_multiturn": "accepted",
    # rollout traces to MLflow (agent/trace.py)
    "sglang_multiturn/run_qwen2.5-3b_gsm8k_tool_agent_mlflow": "accepted",
    # verl's server-mode config: its key is gone from verl's RolloutConfig, which refuses it too
    "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_server": "gsm8k_multiturn_grpo_server.yaml:23: "
    "actor_rollout_ref.rollout.sglang_rollout_mode: a verl key rlrig does not implement",
    "sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu_server": "gsm8k_multiturn_grpo_server.yaml:23: "
    "actor_rollout_ref.rollout.sglang_rollout_mode: a verl key rlrig does not implement",
    # a curriculum sampler from verl's own test suite (it needs verl's repository and verl installed): drawn from,
    # and handed each step's batch (data/custom_sampler.py, driver/curriculum.py)
    "sglang_multiturn/run_qwen0.5b_gsm8k_multiturn_curriculum": "accepted",
    "sglang_multiturn/gsm8k_toolcall_shaping/run_gsm8k_grpo_toolcall_shaping": "accepted",
}


def outcome(name: str, monkeypatch) -> str:
    """Parsed, and the data sampler built as the run's start builds it: verl's test module in place of the one
    its path names, which imports verl."""
    s = SCRIPTS[name]
    folder = str(VERL_FILES) if s.get("config_name") else None
    try:
        cfg = parse_overrides(assemble(None, folder, s.get("config_name"), s["overrides"]))
        if cfg.data.sampler.class_path == "pkg://tests.utils.dataset.test_create_rl_sampler_on_cpu":
            monkeypatch.setitem(
                sys.modules, "tests.utils.dataset.test_create_rl_sampler_on_cpu", verls_sampler_module()
            )
        make_sampler(cfg.data, [{}] * 8, 2)
    except ConfigError as e:
        assert "\n" not in str(e)
        return str(e).replace(f"{VERL_FILES}/", "")
    return "accepted"


def verls_sampler_module() -> types.ModuleType:
    """verl's tests/utils/dataset/test_create_rl_sampler_on_cpu.py as far as the scripts use it: its
    RandomCurriculumSampler (a RandomSampler with an update that does nothing), less verl's base class."""
    m = types.ModuleType("test_create_rl_sampler_on_cpu")

    class RandomCurriculumSampler(torch.utils.data.Sampler):
        def __init__(self, data_source, data_config):
            self.sampler = torch.utils.data.RandomSampler(data_source=data_source)

        def __iter__(self):
            return self.sampler.__iter__()

        def __len__(self) -> int:
            return len(self.sampler)

        def update(self, batch) -> None:
            return

    m.RandomCurriculumSampler = RandomCurriculumSampler
    return m


def test_the_table_covers_every_multi_turn_fsdp_script():
    assert sorted(EXPECTED) == MULTI_TURN


@pytest.mark.parametrize("name", MULTI_TURN)
def test_verls_multi_turn_example_is_accepted_or_refused_as_listed(name, monkeypatch):
    got = outcome(name, monkeypatch)
    assert got == "accepted" if EXPECTED[name] == "accepted" else got.startswith(EXPECTED[name]), got


def test_the_accepted_multi_turn_config_keeps_verls_values():
    s = SCRIPTS["sglang_multiturn/run_qwen2.5-3b_gsm8k_multiturn_4xgpu"]
    cfg = parse_overrides(assemble(None, str(VERL_FILES), s["config_name"], s["overrides"]))
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_user_turns) == (True, 5, 1)  # the file's, then the script's
    assert mt.tool_config_path.endswith("tool_config/gsm8k_tool_config.yaml")
    assert cfg.data.tool_config_path == mt.tool_config_path  # verl's interpolation: the tools in every prompt


def test_verls_tool_and_interaction_configs_load_rlrigs_ports():
    tools = load_tools(str(VERL_FILES / "tool_config" / "gsm8k_tool_config.yaml"))
    assert list(tools) == ["calc_gsm8k_reward"] and type(tools["calc_gsm8k_reward"]).__module__.startswith("rlrig.")
    users = load_interactions(str(VERL_FILES / "interaction_config" / "gsm8k_interaction_config.yaml"))
    assert list(users) == ["gsm8k"]


def test_a_verl_tool_rlrig_has_no_port_of_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"class_name=verl.tools.search_tool.SearchTool cannot be imported"):
        load_tools(str(VERL_FILES / "tool_config" / "search_tool_config.yaml"))


def rows(agent=None, **extra):
    return [{"prompt": [], "agent_name": agent, "extra_info": extra}]


@pytest.mark.parametrize(
    "overrides, data, says",
    [
        # verl picks the loop by agent_name / default_agent_loop; enable alone runs single turn, and rlrig says so
        (["actor_rollout_ref.rollout.multi_turn.enable=True"], rows(), "no row runs tool_agent"),
        (["actor_rollout_ref.rollout.multi_turn.enable=True"], rows("tool_agent"), None),
        ([], rows("react_agent"), "agent_name=react_agent in the data: no agent loop of that name"),
        (["actor_rollout_ref.rollout.multi_turn.format=qwen"], rows("tool_agent"), "multi_turn.format=qwen"),
        (["actor_rollout_ref.rollout.multi_turn.format=qwen"], rows(), None),  # verl builds no parser then either
        (
            ["actor_rollout_ref.hybrid_engine=False", "rollout.nnodes=1", "rollout.n_gpus_per_node=1"],
            rows("tool_agent"),
            None,
        ),
        (
            [
                "actor_rollout_ref.hybrid_engine=False",
                "rollout.nnodes=1",
                "rollout.n_gpus_per_node=1",
                "async_training.staleness_threshold=1",
                "data.train_batch_size=0",
            ],
            rows("tool_agent"),
            None,  # multi-turn partial rollouts go on across syncs (agent/partial.py)
        ),
        (
            [
                f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={VERL_FILES}/interaction_config/"
                "gsm8k_interaction_config.yaml"
            ],
            rows("tool_agent", interaction_kwargs={"query": "q", "ground_truth": "1"}),  # verl's w_tool data: no name
            "interaction_kwargs.name=None: name one of ['gsm8k'] in every row",
        ),
    ],
)
def test_start_up_checks_of_the_agent_loop(overrides, data, says):
    cfg = parse_overrides(["actor_rollout_ref.rollout.free_cache_engine=False", *overrides])
    if says is None or says.startswith("no row"):
        notice = setup.check(cfg, data)
        assert (notice is None) if says is None else (says in notice)
        return
    with pytest.raises(ConfigError, match=None) as e:
        setup.check(cfg, data)
    assert says in str(e.value) and "\n" not in str(e.value)
