"""Sandbox fusion's keys: verl 0.9's three places for them, their checks, the reward function they choose, and
url=local starting `rlrig sandbox` for a run's length."""

from __future__ import annotations

import json
import urllib.request

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward import rules
from rlrig.trainer.reward.sandbox.local import beside_run


def test_verl_09_places_of_the_keys():
    cfg = parse_overrides(
        [
            "reward.sandbox_fusion.url=http://sandbox:8080/run_code",
            "sandbox_fusion.max_concurrent=8",
            "reward_model.sandbox_fusion.memory_limit_mb=512",
        ]
    )
    sf = cfg.reward_model.sandbox_fusion
    assert (sf.url, sf.max_concurrent, sf.memory_limit_mb) == ("http://sandbox:8080/run_code", 8, 512)
    assert parse_overrides([]).reward_model.sandbox_fusion.url is None


@pytest.mark.parametrize(
    "overrides, refusal",
    [
        (
            ["reward_model.sandbox_fusion.url=sandbox:8080"],
            "reward_model.sandbox_fusion.url='sandbox:8080' is not a URL",
        ),
        (["reward_model.sandbox_fusion.max_concurrent=0"], "reward_model.sandbox_fusion.max_concurrent=0 must be at"),
    ],
)
def test_bad_values_are_one_line(overrides, refusal):
    cfg = parse_overrides(overrides)
    with pytest.raises(ConfigError) as e:
        rules.check_reward_setup(cfg, {"openai/gsm8k"})
    assert str(e.value).startswith(refusal) and "\n" not in str(e.value)


def test_the_sandbox_goes_to_the_default_function_only(tmp_path):
    cfg = parse_overrides(["reward_model.sandbox_fusion.url=http://h:1/run_code", "sandbox_fusion.max_concurrent=3"])
    fn = rules.reward_fn(cfg)
    client = fn.keywords["sandbox"]
    assert fn.func is rules.default_compute_score and (client.url, client.memory_limit_mb) == (
        "http://h:1/run_code",
        1024,
    )
    rules.check_reward_setup(cfg, {"apps", "openai/gsm8k"})
    own = tmp_path / "r.py"
    own.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 1.0\n")
    cfg = parse_overrides(
        [
            "reward_model.sandbox_fusion.url=http://h:1/run_code",
            f"custom_reward_function.path={own}",
            "custom_reward_function.name=score",
        ]
    )
    assert rules.reward_fn(cfg).__name__ == "score"  # verl's load_reward_manager: a function of your own as it is


def test_local_starts_rlrig_sandbox_for_the_run():
    cfg = parse_overrides(["reward_model.sandbox_fusion.url=local"])
    with beside_run(cfg) as run_cfg:
        url = run_cfg.reward_model.sandbox_fusion.url
        assert url.startswith("http://127.0.0.1:") and url.endswith("/run_code")
        assert cfg.reward_model.sandbox_fusion.url == "local"  # the config given is left as it was
        body = {"code": "print(6 * 7)", "language": "python", "run_timeout": 5}
        req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert json.loads(resp.read())["run_result"]["stdout"] == "42\n"
    with pytest.raises(OSError):
        urllib.request.urlopen(url.replace("/run_code", "/v1/ping"), timeout=5)
    plain = parse_overrides([])
    with beside_run(plain) as same:
        assert same is plain
