"""The override lists of every shell script in verl's examples/ (at the commit in verl_scripts/overrides.json) that
runs verl's PPO trainer, kept as data with data and model paths replaced (verl_scripts/extract.py writes it).

A script in scope either resolves through rlrig's parser as it is ("accepted") or is refused in one line naming
the first verl key rlrig does not implement; verl_scripts/expected.json records which, so a change in either
shows here. Out of scope, each with its reason in overrides.json and counted in OUT_OF_SCOPE below: Megatron,
NPU/Ascend, TensorRT-LLM, vision-language, multi-turn/agent, and scripts running another entry point (SFT,
generation, split placement's own main_ppo_split.py). docs/trainer/verl.md ("verl's example scripts") gives
the numbers of PER_FOLDER.
"""

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.model.micro_batches import splits_groups

HERE = Path(__file__).parent / "verl_scripts"
DATA = json.loads((HERE / "overrides.json").read_text())
SCRIPTS = DATA["scripts"]
EXPECTED = json.loads((HERE / "expected.json").read_text())
IN_SCOPE = sorted(n for n, s in SCRIPTS.items() if s["scope"] == "in")

OUT_OF_SCOPE = {  # reason -> scripts; a script is out of scope for the first reason that fits it
    "Megatron (ppo_megatron_trainer config, a megatron or mindspeed strategy or model engine, Megatron Lite)": 32,
    "NPU/Ascend": 16,
    "other entry point (SFT, generation, eval, split placement's main_ppo_split.py)": 13,
    "multi-turn/agent (sglang_multiturn, tools, agent loop)": 11,
    "vision-language (multi-modal data or model)": 9,
    "TensorRT-LLM": 1,
}

PER_FOLDER = {  # folder under examples/ -> (scripts, in scope, accepted unchanged)
    "cispo_trainer": (1, 1, 1),
    "generation": (2, 0, 0),
    "gmpo_trainer": (3, 3, 3),
    "gpg_trainer": (2, 1, 1),
    "grpo_trainer": (50, 12, 12),
    "gspo_trainer": (5, 2, 2),
    "mtp_trainer": (1, 0, 0),
    "otb_trainer": (1, 1, 1),
    "ppo_trainer": (24, 17, 15),
    "prefix_grouper": (1, 1, 1),
    "reinforce_plus_plus_trainer": (2, 2, 2),
    "remax_trainer": (2, 2, 2),
    "rloo_trainer": (1, 1, 1),
    "rollout_correction": (2, 2, 2),
    "router_replay": (2, 0, 0),
    "sapo_trainer": (1, 1, 1),
    "sft": (10, 0, 0),
    "sglang_multiturn": (16, 0, 0),
    "split_placement": (1, 0, 0),
    "tuning": (12, 11, 11),
}


def outcome(overrides: list[str]) -> str:
    try:
        parse_overrides(overrides)
    except ConfigError as e:
        msg = str(e)
        assert "\n" not in msg, msg
        return msg
    return "accepted"


def test_every_script_is_in_scope_or_out_with_a_reason():
    assert DATA["verl_commit"] == "b178a3cd56f58b2d502255daba591e92833930a7"
    reasons = Counter(s["scope"] for s in SCRIPTS.values() if s["scope"] != "in")
    print("\nout of scope:")
    for name, s in sorted(SCRIPTS.items()):
        if s["scope"] != "in":
            print(f"  {name}: {s['scope']}")
    assert dict(reasons) == OUT_OF_SCOPE
    assert sorted(EXPECTED) == IN_SCOPE  # the expected table covers exactly the scripts in scope
    for name in IN_SCOPE:
        s = SCRIPTS[name]
        assert s["entry"] == "verl.trainer.main_ppo" and "megatron" not in s.get("config_name", ""), name
        assert not any(re.search(r"\$(?!\{)", o) for o in s["overrides"]), name  # shell variables resolved


@pytest.mark.parametrize("name", IN_SCOPE)
def test_verl_example_is_accepted_or_refused_as_expected(name):
    assert outcome(SCRIPTS[name]["overrides"]) == EXPECTED[name]


def test_share_accepted_unchanged_per_folder():
    got: dict[str, list[int]] = {}
    refusals: dict[str, Counter] = {}
    for s in SCRIPTS.values():
        row = got.setdefault(s["folder"], [0, 0, 0])
        row[0] += 1
        if s["scope"] == "in":
            row[1] += 1
            result = outcome(s["overrides"])
            row[2] += result == "accepted"
            if result != "accepted":
                refusals.setdefault(s["folder"], Counter())[result.split(":")[0]] += 1
    lines = [f"{'folder':<28} scripts in-scope accepted  first refusals"]
    for folder, (n, n_in, ok) in sorted(got.items()):
        refused = ", ".join(f"{k} x{v}" for k, v in sorted(refusals.get(folder, {}).items()))
        lines.append(f"{folder:<28} {n:>7} {n_in:>8} {ok:>8}  {refused}")
    n_in, ok = sum(r[1] for r in got.values()), sum(r[2] for r in got.values())
    lines.append(f"{'whole tree':<28} {len(SCRIPTS):>7} {n_in:>8} {ok:>8}  ({ok / n_in:.0%} accepted unchanged)")
    print("\n" + "\n".join(lines))
    assert {k: tuple(v) for k, v in got.items()} == PER_FOLDER, "\n".join(lines)
    assert (len(SCRIPTS), n_in, ok) == (139, 57, 55)


def test_print_config_of_a_verl_example_through_the_cli():
    s = SCRIPTS["grpo_trainer/run_qwen2-7b"]
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--print-config", *s["overrides"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["actor_rollout_ref"]["rollout"]["n"] == 5 and out["algorithm"]["adv_estimator"] == "grpo"
    assert "data.return_raw_chat" in out["_no_effect_in_rlrig"] and "trainer.device" in out["_rlrig_only_keys"]


# verl's one-step-off-policy recipe scripts (verl/experimental/one_step_off_policy/shell, the same commit), their
# overrides taken as extract.py takes the examples' (bash with every command a stub, paths replaced); verl picks the
# mode by its entry point, rlrig by trainer.async_mode
ONE_STEP = json.loads((Path(__file__).parent / "verl_scripts" / "one_step_off_policy.json").read_text())
ONE_STEP_EXPECTED = dict.fromkeys(
    ["dapo_7b_math_fsdp2_64_64", "dapo_7b_math_fsdp2_64_64_ris", "dapo_7b_math_fsdp2_4_12"], "accepted"
)
# the batch shared by sample, as verl dispatches it: 4_12's 512 prompts do not divide over its 12 training workers,
# nor its 32-prompt mini batch over their 3 sequence-parallel groups, but their samples (x 12) do
SPLITS_GROUPS = {
    "dapo_7b_math_fsdp2_64_64": False,
    "dapo_7b_math_fsdp2_64_64_ris": False,
    "dapo_7b_math_fsdp2_4_12": True,
}


@pytest.mark.parametrize("name", sorted(ONE_STEP_EXPECTED))
def test_verls_one_step_off_policy_scripts(name):
    assert ONE_STEP["verl_commit"] == DATA["verl_commit"]
    overrides = ONE_STEP["scripts"][name]
    assert "actor_rollout_ref.hybrid_engine=False" in overrides and any(o.startswith("rollout.") for o in overrides)
    assert outcome([*overrides, "trainer.async_mode=one_step_off_policy"]) == ONE_STEP_EXPECTED[name]
    cfg = parse_overrides([*overrides, "trainer.async_mode=one_step_off_policy"])
    assert splits_groups(cfg) == SPLITS_GROUPS[name]


# verl's fully async recipe scripts (verl/experimental/fully_async_policy/shell, the same commit), taken as the one-step
# ones; their async_training.* keys choose the mode, so they run unchanged. Left out, with the reason in the file:
# the Megatron ones and one whose --config-name is not in verl's recipe
FULLY_ASYNC = json.loads((Path(__file__).parent / "verl_scripts" / "fully_async_policy.json").read_text())
FULLY_ASYNC_EXPECTED = {
    **dict.fromkeys(
        ["dapo_7b_math_fsdp2_16_16", "dapo_7b_math_fsdp2_32_32", "dapo_7b_math_fsdp2_4_4"]
        + ["dapo_7b_math_fsdp2_64_64", "dapo_7b_math_fsdp2_64_64_mis", "dapo_7b_math_fsdp2_8_8"]
        # multi-turn tool calling with partial rollouts and the retool recipe's data set class (verl needed to load it)
        + ["dapo_7b_async_retool"],
        "accepted",
    ),
    # verl fails at its first step: its 2,048 samples (require_batches 4 x 32 prompts x n 16) do not split into 12
    # equal parts (karmarkar_karp's and DataProto.chunk's asserts); rlrig says so at start-up, of a mini batch's
    "dapo_7b_math_fsdp2_4_12": "actor_rollout_ref.actor.ppo_mini_batch_size=32 prompts x "
    "actor_rollout_ref.rollout.n=16 samples cannot be split over 12 workers (trainer.nnodes x "
    "trainer.n_gpus_per_node); make it a multiple of 3",
}


@pytest.mark.parametrize("name", sorted(FULLY_ASYNC_EXPECTED))
def test_verls_fully_async_scripts(name):
    assert FULLY_ASYNC["verl_commit"] == DATA["verl_commit"]
    assert set(FULLY_ASYNC["scripts"]) == set(FULLY_ASYNC_EXPECTED)
    overrides = FULLY_ASYNC["scripts"][name]
    assert outcome(overrides) == FULLY_ASYNC_EXPECTED[name]
    if FULLY_ASYNC_EXPECTED[name] == "accepted":
        cfg = parse_overrides(overrides)
        assert cfg.trainer.async_mode == "fully_async_policy" and not cfg.actor_rollout_ref.hybrid_engine
