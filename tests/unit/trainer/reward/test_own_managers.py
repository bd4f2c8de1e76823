"""Reward managers of your own, verl 0.9's way: a class written exactly as for verl (only its import line names
rlrig's module), named by every spelling verl reads (reward.reward_manager.source register or importlib, its
module.path, the legacy reward_model.reward_loop_* keys), is built with verl's arguments and scores each sample
through run_single on a DataProto of length 1 with verl's fields; every refusal and failure is one line naming the
class and the fix. Beside verl 0.9.1 (where it is importable), verl's own classes and a class importing only verl run
unchanged."""

import numpy as np
import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tool_model import build_tool_tokenizer
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward import verl_api
from rlrig.trainer.reward.own_managers import OwnRewardError
from rlrig.trainer.reward.rules import check_reward_setup
from rlrig.trainer.reward.scoring import LOOP_SCORE, RewardSource, score
from rlrig.trainer.rollout.engines.base import Rollout

TOK = build_tool_tokenizer()

# written as for verl 0.9: only the import line differs from verl's
MANAGER = """
from rlrig.trainer.reward.verl_api import DataProto, RewardManagerBase, register

CALLS = []


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.25


@register("exact_answer")
class ExactAnswer(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.bonus = float(config.reward.get("reward_kwargs", {}).get("bonus", 0.0))
        self.experiment = config.trainer.experiment_name

    async def run_single(self, data: DataProto) -> dict:
        data = data[-1:]
        item = data[0]
        response_ids = item.batch["responses"]
        valid = item.batch["attention_mask"][-response_ids.shape[-1]:].sum()
        text = await self.loop.run_in_executor(
            None, lambda: self.tokenizer.decode(response_ids[:valid], skip_special_tokens=True)
        )
        fields = item.non_tensor_batch
        CALLS.append({k: fields[k] for k in fields})
        truth = fields["reward_model"]["ground_truth"]
        base = self.compute_score(
            data_source=fields["data_source"], solution_str=text, ground_truth=truth, extra_info=fields["extra_info"]
        )
        right = float(text.strip().endswith(truth))
        info = {"right": right, "base": base, "turns": int(fields["__num_turns__"]), "experiment": self.experiment}
        return {"reward_score": right + self.bonus, "reward_extra_info": info}
"""


@pytest.fixture
def manager_file(tmp_path):
    f = tmp_path / "my_manager.py"
    f.write_text(MANAGER)
    yield f
    verl_api.REWARD_MANAGER.pop("exact_answer", None)


def config(*keys: str):
    return parse_overrides(
        ["actor_rollout_ref.model.path=/no/model", "data.max_prompt_length=16", "data.max_response_length=16", *keys]
    )


def row(q: str, answer: str) -> dict:
    return {
        "prompt": [{"role": "user", "content": q}],
        "data_source": "rlrig/arithmetic",
        "reward_model": {"ground_truth": answer},
        "extra_info": {"index": 3},
    }


def rollout(prompts: list[str], responses: list[str]) -> Rollout:
    """Left-padded prompts, right-padded responses, as the engines return them."""
    P, R = 8, 10
    ids, mask = [], []
    for p, r in zip(prompts, responses, strict=True):
        p_ids, r_ids = TOK.encode(p), TOK.encode(r) + [TOK.eos_token_id]
        ids.append([0] * (P - len(p_ids)) + p_ids + r_ids + [0] * (R - len(r_ids)))
        mask.append([0] * (P - len(p_ids)) + [1] * (len(p_ids) + len(r_ids)) + [0] * (R - len(r_ids)))
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    return Rollout(ids, mask, mask[:, P:].clone(), P)


ROWS = [row("3*4=", "12"), row("2+5=", "7")]
RO = rollout(["3*4=", "3*4=", "2+5=", "2+5="], ["#### 12", "#### 13", "#### 7", "no"])
CALLS_MODULE = []


def scored(cfg, turns=None):
    check_reward_setup(cfg, {"rlrig/arithmetic"})
    src = RewardSource.of(cfg, TOK)
    assert src.own is not None
    CALLS_MODULE[:] = [src.own.cls.run_single.__globals__.get("CALLS")]
    scores, _, extras = score(TOK, src, ROWS, RO, 2, turns)
    return scores.tolist(), extras


SPELLINGS = {
    "verl 0.9, importlib": [
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.module.path={f}",
        "reward.reward_manager.name=ExactAnswer",
    ],
    "verl 0.9, importlib, file://": [
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.module.path=file://{f}",
        "reward.reward_manager.name=ExactAnswer",
        "reward.reward_manager.module.name=anything",
    ],
    "verl 0.9, registered in the reward function's file": [
        "reward.custom_reward_function.path={f}",
        "reward.reward_manager.name=exact_answer",
    ],
    "verl 0.9, registered in module.path's file": [
        "reward.reward_manager.source=register",
        "reward.reward_manager.module.path={f}",
        "reward.reward_manager.name=exact_answer",
    ],
    "legacy reward_model.reward_loop_*": [
        "reward_model.reward_loop_source=importlib",
        "reward_model.reward_loop_module_path={f}",
        "reward_model.reward_loop_class_name=ExactAnswer",
        "reward_model.reward_manager=ExactAnswer",
    ],
    "verl b178a3c's reward_manager section": [
        "reward_manager.source=importlib",
        "reward_manager.module.path={f}",
        "reward_model.reward_manager=ExactAnswer",
    ],
}


@pytest.mark.parametrize("spelling", SPELLINGS)
def test_a_verl_reward_manager_scores_each_sample_by_every_spelling_verl_reads(manager_file, spelling):
    keys = [k.format(f=manager_file) for k in SPELLINGS[spelling]]
    scores, extras = scored(config(*keys, "trainer.experiment_name=exp7"))
    assert scores == [1.0, 0.0, 1.0, 0.0]
    custom = "custom_reward_function" in spelling or "reward function" in spelling
    # compute_score: the custom function where one is named, else the default (verl's keywords, rlrig's rules)
    bases = [0.25] * 4 if custom else [1.0, 0.0, 1.0, 0.0]
    assert [e["base"] for e in extras] == bases
    assert [e["right"] for e in extras] == [1.0, 0.0, 1.0, 0.0]
    assert {e["experiment"] for e in extras} == {"exp7"} and {e["turns"] for e in extras} == {2}


def test_the_sample_reaches_run_single_with_verls_fields(manager_file):
    keys = [k.format(f=manager_file) for k in SPELLINGS["verl 0.9, importlib"]]
    turns = [{"num_turns": 4, "turn_scores": [0.5], "tool_rewards": []} for _ in range(4)]
    scored(config(*keys), turns)
    calls = CALLS_MODULE[0]
    assert len(calls) == 4
    first = calls[0]
    assert first["data_source"] == "rlrig/arithmetic" and first["reward_model"] == {"ground_truth": "12"}
    assert first["raw_prompt"] == [{"role": "user", "content": "3*4="}] and first["index"] == 3
    assert first["__num_turns__"] == 4 and first["tool_extra_fields"] == {"turn_scores": [0.5], "tool_rewards": []}
    assert first["prompt_len"] == len(TOK.encode("3*4=")) and first["response_len"] == len(TOK.encode("#### 12")) + 1
    assert first["extra_info"] == {"index": 3} and first["extra_info"] is not ROWS[0]["extra_info"]


def test_the_manager_reads_verl_09s_config_and_a_loops_own_score_is_not_handed_to_it(manager_file):
    keys = [k.format(f=manager_file) for k in SPELLINGS["verl 0.9, importlib"]]
    turns = [{"num_turns": 2} for _ in range(4)]
    turns[1][LOOP_SCORE] = 0.75  # an agent loop of your own scored it: verl calls no reward manager for it
    scores, extras = scored(config(*keys, "+reward.reward_kwargs.bonus=0.5"), turns)  # verl 0.9's place
    assert scores == [1.5, 0.75, 1.5, 0.5] and extras[1] == {}
    assert len(CALLS_MODULE[0]) == 3


def test_rlrigs_naive_and_dapo_stay_rlrigs_own():
    for name in ("naive", "dapo"):
        src = RewardSource.of(config(f"reward.reward_manager.name={name}"), TOK)
        assert src.own is None


def test_rlrigs_data_proto_indexes_as_verls():
    d = verl_api.DataProto.from_dict(
        {"responses": torch.arange(6).view(3, 2)}, {"data_source": np.array(["a", "b", "c"], dtype=object)}
    )
    assert len(d) == 3 and len(d[-1:]) == 1 and len(d[[0, 2]]) == 2
    assert d[1].batch["responses"].tolist() == [2, 3] and d[1].non_tensor_batch["data_source"] == "b"
    assert d[-1:][0].non_tensor_batch["data_source"] == "c"


BAD_CLASSES = """
from rlrig.trainer.reward.verl_api import RewardManagerBase


class NotOne:
    async def run_single(self, data):
        return {"reward_score": 1.0}


class OldStyle:
    def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key="data_source"):
        pass

    def __call__(self, data, return_dict=False):
        return None


class Sync(RewardManagerBase):
    def run_single(self, data):
        return {"reward_score": 1.0}


class Placed(RewardManagerBase):
    async def run_single(self, data):
        return {"reward_score": 1.0}

    @classmethod
    def assemble_rm_scores(cls, data, scores):
        return None
"""


@pytest.mark.parametrize(
    "keys, words",
    [
        (["source=importlib", "module.path={d}/missing.py", "name=X"], "missing.py does not exist"),
        (["source=importlib", "module.path={f}", "name=Nope"], "has no Nope"),
        (["source=importlib", "module.path={f}"], "set it to your class's name"),
        (["source=importlib", "name=ExactAnswer"], "needs reward.reward_manager.module.path"),
        (["name=no_such_manager"], "no reward manager of that name; rlrig's are naive, dapo (verl 0.9's gdpo"),
        (["name=no_such_manager", "module.path={f}"], "no reward manager is registered under that name"),
        (["source=somewhere", "name=X"], "verl's sources are register and importlib"),
        (["source=importlib", "module.path={b}", "name=NotOne"], "is not a RewardManagerBase; subclass"),
        (["source=importlib", "module.path={b}", "name=OldStyle"], "AbstractRewardManager"),
        (["source=importlib", "module.path={b}", "name=Sync"], "async def run_single"),
        (["source=importlib", "module.path={b}", "name=Placed"], "overrides assemble_rm_scores, which rlrig does not"),
    ],
)
def test_a_bad_reward_manager_is_refused_at_start_up_in_one_line(manager_file, keys, words):
    bad = manager_file.parent / "bad_managers.py"
    bad.write_text(BAD_CLASSES)
    spelled = [f"reward.reward_manager.{k}".format(f=manager_file, d=manager_file.parent, b=bad) for k in keys]
    with pytest.raises(ConfigError) as e:
        check_reward_setup(config(*spelled), {"rlrig/arithmetic"})
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_manager_of_your_own_beside_a_reward_model_is_handed_a_served_judge(manager_file):
    """As verl 0.9 hands its reward-model servers' address to every reward manager: the reward model is served as a
    generative judge (reward/judge.py), which needs its model named."""
    from rlrig.trainer.reward.own_managers import verl_kwargs
    from rlrig.trainer.reward.rules import serves_judge

    keys = [k.format(f=manager_file) for k in SPELLINGS["verl 0.9, importlib"]]
    with pytest.raises(ConfigError, match="serves a generative judge: set reward_model.model.path"):
        check_reward_setup(config(*keys, "reward_model.enable=True"), {"rlrig/arithmetic"})
    cfg = config(*keys, "reward_model.enable=True", "reward_model.model.path=/judge", "reward_model.rollout.name=hf")
    check_reward_setup(cfg, {"rlrig/arithmetic"})
    assert serves_judge(cfg)

    class Takes:
        def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
            pass

    judge = {"reward_router_address": "h:1", "reward_model_tokenizer": "tok"}
    assert verl_kwargs(Takes, "c", "t", "f", judge) == {"config": "c", "tokenizer": "t", "compute_score": "f", **judge}
    assert verl_kwargs(Takes, "c", "t", "f", {})["reward_router_address"] is None


FAILING = """
from rlrig.trainer.reward.verl_api import RewardManagerBase


class Raises(RewardManagerBase):
    async def run_single(self, data):
        raise ValueError("no ground truth here")


class Number(RewardManagerBase):
    async def run_single(self, data):
        return 1.0


class NoScore(RewardManagerBase):
    async def run_single(self, data):
        return {"score": 1.0}


class NotANumber(RewardManagerBase):
    async def run_single(self, data):
        return {"reward_score": "high"}


class BadBuild(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.threshold = config.reward.reward_kwargs.threshold

    async def run_single(self, data):
        return {"reward_score": 1.0}
"""


@pytest.mark.parametrize(
    "name, words",
    [
        ("Raises", "reward manager Raises (rlrig_extern_"),
        ("Raises", "run_single raised ValueError: no ground truth here at "),
        ("Number", "run_single returned float; return {'reward_score': float"),
        ("NoScore", "run_single returned a dict without reward_score (keys ['score'])"),
        ("NotANumber", "reward_score='high', not a number"),
        (
            "BadBuild",
            "raised ConfigAttributeError when built with verl's arguments (config, tokenizer, compute_score, ",
        ),
    ],
)
def test_a_manager_that_fails_in_the_step_ends_it_in_one_line(tmp_path, name, words):
    f = tmp_path / "failing.py"
    f.write_text(FAILING)
    cfg = config("reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={f}")
    cfg.reward_model.reward_manager = name
    with pytest.raises(OwnRewardError) as e:
        score(TOK, RewardSource.of(cfg, TOK), ROWS, RO, 2)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


# --- beside verl 0.9.1 (its own classes, and a class importing verl only) ---

VERL_ONLY = """
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase


@register("verl_only_length")
class VerlOnly(RewardManagerBase):
    async def run_single(self, data: DataProto) -> dict:
        assert isinstance(data, DataProto) and isinstance(data.batch, TensorDict) and len(data) == 1
        item = data[0]
        n = int(item.batch["attention_mask"][-item.batch["responses"].shape[-1]:].sum())
        return {"reward_score": n / 10, "reward_extra_info": {"length": n}}
"""


def test_a_class_written_for_verl_alone_runs_unchanged_beside_verl(tmp_path):
    pytest.importorskip("verl.experimental.reward_loop.reward_manager")
    f = tmp_path / "verl_only.py"
    f.write_text(VERL_ONLY)
    for keys in (
        ["reward.reward_manager.source=importlib", f"reward.reward_manager.module.path={f}"],
        [f"reward.reward_manager.module.path={f}"],  # verl's @register, its name
    ):
        name = "VerlOnly" if "source=importlib" in keys[0] else "verl_only_length"
        scores, extras = scored(config(*keys, f"reward.reward_manager.name={name}"))
        lengths = [len(TOK.encode(r)) + 1 for r in ["#### 12", "#### 13", "#### 7", "no"]]
        assert extras == [{"length": n} for n in lengths] and scores == pytest.approx([n / 10 for n in lengths])


@pytest.mark.parametrize("spelling", ["pkg", "register"])
def test_verls_own_naive_manager_runs_unchanged_beside_verl_and_scores_as_rlrigs(spelling):
    pytest.importorskip("verl.experimental.reward_loop.reward_manager")
    keys = (
        [
            "reward.reward_manager.source=importlib",
            "reward.reward_manager.module.path=pkg://verl.experimental.reward_loop.reward_manager.naive",
            "reward.reward_manager.name=NaiveRewardManager",
        ]
        if spelling == "pkg"
        else ["reward.reward_manager.name=gdpo", "trainer.experiment_name=exp"]  # verl's gdpo reads the trainer's
    )
    cfg = config(*keys)
    check_reward_setup(cfg, {"rlrig/arithmetic"})
    src = RewardSource.of(cfg, TOK)
    assert type(src.own.manager).__module__.startswith("verl.experimental.reward_loop.reward_manager")
    scores, _, extras = score(TOK, src, ROWS, RO, 2)
    rlrig_scores, _, rlrig_extras = score(TOK, RewardSource.of(config(), TOK), ROWS, RO, 2, number_as_acc=True)
    assert scores.tolist() == rlrig_scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert [e["acc"] for e in extras] == [e["acc"] for e in rlrig_extras]
