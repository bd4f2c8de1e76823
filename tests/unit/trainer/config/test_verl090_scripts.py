"""verl 0.9.0's example scripts (tag v0.9.0) through rlrig's start-up parser, as test_verl_scripts.py does for b178a3c.

verl_scripts/overrides_0.9.0.json holds every shell script of verl 0.9.0's examples/ with its overrides as bash
resolves them (the scripts keep them in bash arrays, "${ACTOR[@]}"), written by
`verl_scripts/extract.py --git-dir DIR --ref v0.9.0`. Each script in scope (FSDP training through
verl.trainer.main_ppo) is accepted unchanged or refused in one line naming its first key rlrig does not take;
verl_scripts/expected_0.9.0.json pins which. Out of scope, by extract.py's SCOPE_RULES (first match) and counted in
OUT_OF_SCOPE: Megatron (and MindSpeed, Megatron Lite), NPU/Ascend, vision-language, another training engine
(VeOmni, Automodel, TorchTitan), and another entry point (SFT, generation, fully async, and main_ppo_sync, which
verl 0.9.0 does not ship). docs/trainer/verl.md ("verl 0.9.0's example scripts") gives the numbers of PER_FOLDER.
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

HERE = Path(__file__).parent / "verl_scripts"
DATA = json.loads((HERE / "overrides_0.9.0.json").read_text())
SCRIPTS = DATA["scripts"]
EXPECTED = json.loads((HERE / "expected_0.9.0.json").read_text())
IN_SCOPE = sorted(n for n, s in SCRIPTS.items() if s["scope"] == "in")

OUT_OF_SCOPE = {  # reason -> scripts; a script is out of scope for the first reason that fits it
    "Megatron (ppo_megatron_trainer config, a megatron or mindspeed strategy or model engine, Megatron Lite)": 33,
    "other entry point (SFT, generation, eval, split placement's main_ppo_split.py)": 19,
    "vision-language (multi-modal data or model)": 14,
    "another training engine (VeOmni, Automodel, TorchTitan)": 8,
    "NPU/Ascend": 7,
}

PER_FOLDER = {  # folder under examples/ -> (scripts, in scope, accepted unchanged)
    "ascend_extras": (9, 0, 0),
    "cispo_trainer": (1, 1, 1),
    "dppo_trainer": (1, 0, 0),
    "gdpo_trainer": (1, 1, 1),
    "generation": (1, 0, 0),
    "gmpo_trainer": (1, 1, 1),
    "gpg_trainer": (2, 1, 1),
    "grpo_trainer": (41, 8, 8),
    "gspo_trainer": (2, 1, 1),
    "mtp_trainer": (3, 0, 0),
    "on_policy_distillation_trainer": (7, 1, 1),
    "otb_trainer": (1, 1, 1),
    "ppo_trainer": (2, 1, 1),
    "prefix_grouper": (1, 1, 1),
    "profile": (4, 1, 1),
    "reinforce_plus_plus_trainer": (1, 1, 1),
    "remax_trainer": (2, 1, 1),
    "rloo_trainer": (1, 1, 1),
    "rollout_correction": (2, 2, 2),
    "router_replay": (2, 0, 0),
    "sapo_trainer": (2, 1, 0),
    "sft": (15, 0, 0),
    "tuning": (7, 4, 4),
}

FIRST_REFUSALS = {  # the key each refused script stops at -> scripts
    "actor_rollout_ref.actor.policy_loss.tau_pos": 1,
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
    assert DATA["verl_ref"] == "v0.9.0"
    assert DATA["verl_commit"] == "483b8a009ba3a97563edee3a19887e4862b8094a"
    assert dict(Counter(s["scope"] for s in SCRIPTS.values() if s["scope"] != "in")) == OUT_OF_SCOPE
    assert sorted(EXPECTED) == IN_SCOPE  # the expected table covers exactly the scripts in scope
    for name in IN_SCOPE:
        s = SCRIPTS[name]
        assert s["entry"] == "verl.trainer.main_ppo" and "megatron" not in s.get("config_name", ""), name
        assert s["overrides"], name  # bash reached the command: its arrays expanded
        assert not any(re.search(r"\$(?!\{)", o) for o in s["overrides"]), name  # shell variables resolved
        assert not any(re.search(r"device=npu|model_engine=|image_key", o) for o in s["overrides"]), name


def test_scripts_for_either_device_resolve_their_gpu_path():
    # the script picks its device by probing torch_npu; the probe fails here as on a GPU machine
    overrides = SCRIPTS["grpo_trainer/run_qwen3_8b_fsdp"]["overrides"]
    assert "trainer.n_gpus_per_node=8" in overrides
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=False" in overrides
    assert not any("ulysses" in o for o in overrides)


@pytest.mark.parametrize("name", IN_SCOPE)
def test_verl090_example_is_accepted_or_refused_as_expected(name):
    assert outcome(SCRIPTS[name]["overrides"]) == EXPECTED[name]


def test_share_accepted_unchanged_per_folder():
    got: dict[str, list[int]] = {}
    first_refusals: Counter = Counter()
    for s in SCRIPTS.values():
        row = got.setdefault(s["folder"], [0, 0, 0])
        row[0] += 1
        if s["scope"] == "in":
            row[1] += 1
            result = outcome(s["overrides"])
            row[2] += result == "accepted"
            if result != "accepted":
                first_refusals[result.split(":")[0].split("=")[0]] += 1
    lines = [f"{'folder':<32} scripts in-scope accepted"]
    lines += [f"{folder:<32} {n:>7} {n_in:>8} {ok:>8}" for folder, (n, n_in, ok) in sorted(got.items())]
    n_in, ok = sum(r[1] for r in got.values()), sum(r[2] for r in got.values())
    lines.append(f"{'whole tree':<32} {len(SCRIPTS):>7} {n_in:>8} {ok:>8}  ({ok / n_in:.0%} accepted unchanged)")
    lines += ["first refusals:"] + [f"  {k} x{v}" for k, v in first_refusals.most_common()]
    print("\n" + "\n".join(lines))
    assert {k: tuple(v) for k, v in got.items()} == PER_FOLDER, "\n".join(lines)
    assert dict(first_refusals) == FIRST_REFUSALS
    assert (len(SCRIPTS), n_in, ok) == (109, 28, 27)


def test_print_config_of_a_verl090_example_through_the_cli():
    # the values the script's bash arrays hold reach rlrig's config as verl's keys
    s = SCRIPTS["grpo_trainer/run_qwen3_8b_fsdp"]
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "train", "--print-config", *s["overrides"]],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    a = out["actor_rollout_ref"]
    assert (a["rollout"]["n"], a["rollout"]["tensor_model_parallel_size"]) == (5, 2)
    assert a["actor"]["kl_loss_type"] == "low_var_kl" and a["actor"]["use_dynamic_bsz"] is True
    assert a["ref"]["fsdp_config"]["param_offload"] is True and a["actor"]["fsdp_config"]["param_offload"] is False
    assert out["data"]["train_files"] == ["/data/train_0.parquet", "/data/train_1.parquet"]
