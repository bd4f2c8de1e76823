"""custom_reward_function.path/name as verl's get_custom_reward_fn loads them (its load_extern_object): a .py file,
bare or file://, or pkg:// an installed module; a bad one refused in one line naming the keys."""

import sys

import pytest

from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward.rules import default_compute_score, gsm8k_score, load_reward_fn

SOURCE = "def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n"


@pytest.fixture
def reward_file(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path / "my_rewards.py"
    sys.modules.pop("my_rewards", None)


@pytest.mark.parametrize("spelled", ["{f}", "file://{f}", "pkg://my_rewards"])
def test_the_reward_function_loads_as_verl_names_it(reward_file, spelled):
    fn = load_reward_fn(spelled.format(f=reward_file), "score")
    assert fn("any", "#### 1", "1") == 0.5


@pytest.mark.parametrize(
    "path, name, words",
    [
        ("{d}/missing.py", "score", "missing.py does not exist"),
        ("{f}", "nothing", "has no nothing"),
        ("pkg://no_such_rewards_module", "score", "cannot be imported"),
        ("{f}", "", "name the object in it"),
    ],
)
def test_a_bad_reward_function_is_refused_in_one_line(reward_file, path, name, words):
    with pytest.raises(ConfigError) as e:
        load_reward_fn(path.format(f=reward_file, d=reward_file.parent), name)
    assert str(e.value).startswith("custom_reward_function.path/name: ") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_no_path_is_the_rule_based_score():
    assert load_reward_fn(None, "compute_score") is default_compute_score
    assert default_compute_score("rlrig/arithmetic", "so #### 12", "12") == gsm8k_score("#### 12", "12") == 1.0
