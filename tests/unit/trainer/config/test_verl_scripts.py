"""The override lists of verl's FSDP example scripts (examples/ppo_trainer and examples/grpo_trainer, leaving
out Megatron, NPU, TensorRT-LLM and vision-language ones), kept as data in verl_scripts/overrides.json with
data and model paths replaced: each either resolves as it is, or is refused in one line naming the verl key
rlrig does not implement. `outcome` records which; the README's "Coming from verl" counts them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

SCRIPTS = json.loads((Path(__file__).parent / "verl_scripts" / "overrides.json").read_text())


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_verl_example_resolves_or_is_refused_by_key(name):
    s = SCRIPTS[name]
    if s["outcome"] == "ok":
        parse_overrides(s["overrides"])
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides(s["overrides"])
    msg = str(e.value)
    assert msg.startswith(s["outcome"]) and "\n" not in msg, msg


def test_how_many_run_unchanged():
    ok = sorted(n for n, s in SCRIPTS.items() if s["outcome"] == "ok")
    assert len(SCRIPTS) == 30 and len(ok) == 27, ok


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
