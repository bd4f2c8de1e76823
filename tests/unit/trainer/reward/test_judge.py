"""A generative judge's reward code: rlrig's judge function (reward/judge_fn.py) building the judge's request and
reading its verdict, custom_reward_function.reward_kwargs reaching a function as verl's get_custom_reward_fn passes
them, the calls of a scoring run together where a judge answers them, and the start-up checks that decide a run
serves a judge."""

import asyncio
import threading
import time

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward import judge_fn
from rlrig.trainer.reward.judge import NO_JUDGE, JudgeLink, check_judge, takes_router
from rlrig.trainer.reward.rules import check_reward_setup, load_reward_fn, serves_judge, with_kwargs
from rlrig.trainer.reward.scoring import RewardSource

ROW = {"question": "3+4="}


@pytest.mark.parametrize(
    ("reply", "kw", "want"),
    [
        ("7", {}, 7.0),
        ("I think 3, no: 8", {}, 8.0),  # the last number
        ("Score: 9/10", {"verdict": r"Score: (\d+)"}, 9.0),
        ("Score: 10", {"verdict": r"Score: (\d+)", "scale": [1, 10]}, 1.0),
        ("Score: 1", {"verdict": r"Score: (\d+)", "scale": [1, 10]}, 0.0),
        ("yes", {"verdict": r"yes"}, None),  # a match that is no number
        ("no verdict here", {}, None),
        ("-2.5", {}, -2.5),
    ],
)
def test_a_verdict_is_read_by_the_rule(reply, kw, want):
    assert judge_fn.verdict(reply, kw) == want


def test_the_judges_messages_come_from_the_template_over_the_rows_fields():
    kw = {"template": "{question}|{response}|{ground_truth}|{data_source}", "system": "be strict"}
    assert judge_fn.messages("src", "#### 7", "7", ROW, kw) == [
        {"role": "system", "content": "be strict"},
        {"role": "user", "content": "3+4=|#### 7|7|src"},
    ]
    assert "Problem:\n3+4=" in judge_fn.messages("src", "#### 7", "7", ROW, {})[0]["content"]  # the default


def test_a_template_field_the_row_lacks_is_named():
    with pytest.raises(ValueError, match=r"names 'answer'.*it has question"):
        judge_fn.messages("src", "x", "7", ROW, {"template": "{answer}"})


def test_a_prompt_and_a_parse_function_of_your_own_replace_template_and_rule(tmp_path):
    f = tmp_path / "mine.py"
    f.write_text(
        "def ask(ds, sol, gt, info):\n    return [{'role': 'user', 'content': f'{sol}?'}]\n"
        "def read(reply):\n    return 1.0 if reply.strip() == 'yes' else None\n"
    )
    kw = {"prompt_fn": f"{f}:ask", "parse_fn": f"{f}:read"}
    assert judge_fn.messages("s", "#### 7", "7", ROW, kw) == [{"role": "user", "content": "#### 7?"}]
    assert judge_fn.verdict(" yes", kw) == 1.0
    assert judge_fn.verdict("no", kw) is None


class FakeJudge:
    """A judge's server answering with `replies` in turn, recording the requests (judge_fn.ask's place)."""

    def __init__(self, replies):
        self.replies, self.bodies = list(replies), []

    async def __call__(self, address, body):
        self.bodies.append((address, body))
        return self.replies.pop(0)


@pytest.mark.parametrize(
    ("reply", "kw", "score", "judged", "failed"),
    [
        ("10", {"scale": [1, 10]}, 1.0, 1.0, False),
        ("garbled", {}, 0.0, 0.0, True),
        ("garbled", {"unparsed_score": -1}, -1.0, -1.0, True),
        ("5", {"scale": [0, 10], "rule_weight": 2.0}, 2.5, 0.5, False),  # the rule's 1 for "#### 7", times 2
    ],
)
def test_compute_score_returns_verls_dict_with_the_judges_part(monkeypatch, reply, kw, score, judged, failed):
    fake = FakeJudge([reply])
    monkeypatch.setattr(judge_fn, "ask", fake)
    out = asyncio.run(
        judge_fn.compute_score(
            "rlrig/arithmetic", "#### 7", "7", ROW, reward_router_address="h:1", reward_model_tokenizer=None, **kw
        )
    )
    assert out == {"score": score, "judge_score": judged, "judge_parse_failed": failed, "rule_score": 1.0}
    address, body = fake.bodies[0]
    assert address == "h:1" and body["temperature"] == 0.0 and body["max_tokens"] == 64


def test_rule_weight_on_a_source_without_a_rule_is_refused(monkeypatch):
    monkeypatch.setattr(judge_fn, "ask", FakeJudge(["1"]))
    with pytest.raises(ValueError, match="rule_weight: data_source 'mine' has no rule-based reward"):
        asyncio.run(judge_fn.compute_score("mine", "x", "1", ROW, reward_router_address="h:1", rule_weight=1))


def test_reward_kwargs_reach_the_function_over_its_own_keywords_and_keep_its_signature(tmp_path):
    f = tmp_path / "fn.py"
    f.write_text(
        "def plain(data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None, k=0):\n"
        "    return k\n"
        "async def coro(data_source, solution_str, ground_truth, extra_info=None, k=0):\n    return k\n"
    )
    plain = load_reward_fn(str(f), "plain", reward_kwargs={"k": 3})
    assert plain("s", "x", "1", k=1) == 3  # verl: the config's reward_kwargs win
    assert takes_router(plain)
    coro = load_reward_fn(str(f), "coro", reward_kwargs={"k": 4})
    assert asyncio.run(coro("s", "x", "1")) == 4
    assert not takes_router(coro)
    assert with_kwargs(len, {}) is len


def _source(fn, judge=NO_JUDGE) -> RewardSource:
    return RewardSource(fn, None, None, "prompt", None, None, judge)


class Link(JudgeLink):
    """A JudgeLink with no server behind it (the address is only passed on)."""

    def __init__(self):
        super().__init__("h:1", "tok", sleeps=False, reports=False)


def test_a_scorings_calls_run_together_where_a_judge_answers_them():
    inside, most, lock = [0], [0], threading.Lock()

    def fn(ds, sol, gt, info, reward_router_address=None, reward_model_tokenizer=None):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.05)
        with lock:
            inside[0] -= 1
        return (reward_router_address, reward_model_tokenizer)

    calls = [(("s", str(i), "1", {}), {}) for i in range(8)]
    assert _source(fn, Link()).call_all(calls) == [("h:1", "tok")] * 8
    assert most[0] > 1
    most[0] = 0
    assert _source(fn).call_all(calls) == [(None, None)] * 8  # no judge: one after another, as before
    assert most[0] == 1


def test_coroutine_functions_are_gathered_on_one_loop_with_or_without_a_judge():
    async def fn(ds, sol, gt, info, **kw):
        await asyncio.sleep(0.01)
        return sol + str(sorted(kw))

    calls = [(("s", str(i), "1", {}), {}) for i in range(3)]
    assert _source(fn).call_all(calls) == ["0[]", "1[]", "2[]"]
    routed = _source(fn, Link()).call_all(calls)
    assert routed == [f"{i}['reward_model_tokenizer', 'reward_router_address']" for i in range(3)]


def test_judge_metrics_count_parse_failures_and_spread_the_judges_scores():
    fields = [
        {"judge_score": 1.0, "judge_parse_failed": False},
        {"judge_score": 0.0, "judge_parse_failed": True},
        {"judge_score": 0.5, "judge_parse_failed": False},
        {},
    ]
    assert Link().metrics(fields) == {
        "reward/judge/parse_failures": 1,
        "reward/judge/score/mean": 0.5,
        "reward/judge/score/max": 1.0,
        "reward/judge/score/min": 0.0,
    }
    assert NO_JUDGE.metrics(fields) == {}


@pytest.fixture
def judge_file(tmp_path):
    f = tmp_path / "genrm.py"
    f.write_text(
        "async def compute_score(data_source, solution_str, ground_truth, extra_info, reward_router_address,\n"
        "                        reward_model_tokenizer):\n    return 0.0\n"
        "def with_rm(data_source, solution_str, ground_truth, extra_info, rm_score):\n    return rm_score\n"
        "def neither(data_source, solution_str, ground_truth, extra_info):\n    return 0.0\n"
    )
    return f


def _cfg(*overrides):
    return parse_overrides(["reward_model.enable=True", *overrides])


def test_a_function_that_takes_the_judges_address_makes_the_reward_model_a_served_judge(judge_file, tmp_path):
    model = tmp_path / "judge"
    cfg = _cfg(
        f"custom_reward_function.path={judge_file}", f"reward_model.model.path={model}", "reward_model.rollout.name=hf"
    )
    assert serves_judge(cfg)
    check_reward_setup(cfg, {"anything"})  # the function decides the sources it scores
    with_rm = _cfg(f"custom_reward_function.path={judge_file}", "custom_reward_function.name=with_rm")
    assert not serves_judge(with_rm)
    assert not serves_judge(parse_overrides([f"custom_reward_function.path={judge_file}"]))  # no reward model


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ((), r"set reward_model.model.path \(verl 0.9: reward.reward_model.model_path\)"),
        (("reward_model.model.path=/j", "reward_model.rollout.name=trtllm"), "served by one of hf, vllm, sglang"),
        (
            (
                "reward_model.model.path=/j",
                "reward_model.rollout.name=hf",
                "reward_model.rollout.tensor_model_parallel_size=2",
            ),
            "set it to 1",
        ),
        (
            (
                "reward_model.model.path=/j",
                "reward_model.rollout.name=hf",
                "+reward_model.rollout.engine_kwargs.trt.x=1",
            ),
            "engine_kwargs.trt",
        ),
        (
            ("reward_model.model.path=/j", "reward_model.rollout.name=sglang"),
            "the judge's engine is not installed here",
        ),
    ],
)
def test_a_judge_that_cannot_be_served_is_refused_in_one_line(judge_file, overrides, match):
    cfg = _cfg(f"custom_reward_function.path={judge_file}", *overrides)
    with pytest.raises(ConfigError, match=match):
        check_judge(cfg)


def test_a_function_beside_a_reward_model_that_takes_neither_is_refused_naming_both(judge_file):
    cfg = _cfg(f"custom_reward_function.path={judge_file}", "custom_reward_function.name=neither")
    with pytest.raises(ConfigError, match="rm_score, or, for a generative judge, .*reward_router_address"):
        check_reward_setup(cfg, {"x"})


def test_verl_09s_reward_keys_reach_the_judges_settings(judge_file):
    cfg = parse_overrides(
        [
            "reward.reward_model.enable=True",
            "reward.reward_model.model_path=/judge",
            "reward.reward_model.rollout.name=vllm",
            f"reward.custom_reward_function.path={judge_file}",
            "+reward.custom_reward_function.reward_kwargs.max_tokens=8",
        ]
    )
    assert cfg.reward_model.model.path == "/judge" and cfg.reward_model.rollout.name == "vllm"
    assert cfg.custom_reward_function.reward_kwargs == {"max_tokens": 8}
    assert serves_judge(cfg)


@pytest.mark.parametrize("judge", [NO_JUDGE, Link()], ids=["alone", "with a judge"])
def test_a_reward_function_that_raises_stops_the_run_in_one_line_naming_it_and_where(judge):
    from rlrig.trainer.reward.scoring import RewardFunctionError

    def my_reward(ds, sol, gt, info, **kw):
        raise KeyError("question")

    with pytest.raises(RewardFunctionError) as e:
        _source(my_reward, judge).call_all([(("s", "x", "1", {}), {})])
    text = str(e.value)
    assert "reward function" in text and "my_reward raised KeyError: 'question' at " in text, text
    assert __file__ in text and "\n" not in text
