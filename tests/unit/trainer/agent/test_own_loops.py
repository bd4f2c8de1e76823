"""Agent loops of your own, verl's way: loops written exactly as for verl 0.9 (only the import line names rlrig's
module) run through rlrig's agent rollout over a scripted engine; their masks, scores, turns and extra fields reach
the rollout and the scorer; the loop a row runs is chosen by the config file, default_agent_loop and agent_name;
every refusal and failure is one line naming what is wrong."""

import asyncio
from typing import Any
from uuid import uuid4

import pytest
import torch

from rlrig.trainer.agent import own_loops
from rlrig.trainer.agent.chat import Deltas
from rlrig.trainer.agent.own_loops import OwnLoopError, loop_table
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.agent.setup import check

# the loops below are written as for verl 0.9: only this import differs from verl's
from rlrig.trainer.agent.verl_api import AgentLoopBase, AgentLoopOutput, register
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tool_model import build_tool_tokenizer
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward.scoring import LOOP_SCORE, RewardSource, score
from rlrig.trainer.rollout.engines.base import pack_responses

TOK = build_tool_tokenizer()
EOS = TOK.eos_token
HERE = __name__


class SingleTurn(AgentLoopBase):
    """verl's SingleTurnAgentLoop, text only: the prompt through the template, one generate, merged."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        metrics = {}
        output = await self.server_manager.generate(
            request_id=uuid4().hex, prompt_ids=prompt_ids, sampling_params=sampling_params
        )
        merge_result, response_mask, response_logprobs = await self.ct_merge_assistant_token(
            prompt_ids, output.token_ids, [], [] if output.log_probs else None, assistant_logprobs=output.log_probs
        )
        response_ids = merge_result.token_ids[-len(response_mask) :] if response_mask else []
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[: self.response_length],
            response_mask=response_mask[: self.response_length],
            response_logprobs=response_logprobs[: self.response_length] if response_logprobs else None,
            num_turns=2,
            metrics=metrics,
            extra_fields={"turn_scores": [], "tool_rewards": []},
        )


@register("retry")
class Retry(AgentLoopBase):
    """Answer, read a user's verdict (a context merge), answer again; scores itself when `scored`."""

    def __init__(self, *args, scored: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.scored = scored

    async def run(self, sampling_params, **kwargs):
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        ids, mask = list(prompt_ids), []
        for turn in range(2):
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=ids, sampling_params={**sampling_params, "max_tokens": 8}
            )
            merged, mask, _ = await self.ct_merge_assistant_token(ids, out.token_ids, mask)
            ids = merged.token_ids
            messages.append({"role": "assistant", "content": self.tokenizer.decode(out.token_ids)})
            if turn == 0:
                updated = messages + [{"role": "user", "content": "again"}]
                merged, mask, _ = await self.ct_merge_context_msg(messages, updated, ids, mask)
                ids, messages = merged.token_ids, updated
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=ids[len(prompt_ids) :],
            response_mask=mask,
            reward_score=0.75 if self.scored else None,
            num_turns=4,
            metrics={"generate_sequences": 0.5},
            extra_fields={"index_seen": kwargs["index"], "data_source": kwargs["data_source"]},
        )


class Raises(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        await self.server_manager.generate(request_id="r", prompt_ids=[1], sampling_params=sampling_params)
        raise KeyError("no_such_column")


class BadMask(AgentLoopBase):
    async def run(self, sampling_params, **kwargs):
        return AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=[1], metrics={})


class NotALoop:
    pass


# --- the harness ---


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class Engine:
    """The engine's interface: every context is answered `#### <its length>`, each call recorded."""

    def __init__(self):
        self.calls, self.rested = [], 0

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        self.calls.append((len(prompts), n, max_new))
        turns = [ids(f"#### {len(p)}{EOS}") for p in prompts for _ in range(n)]
        return pack_responses(prompts, n, turns, None, max_new or 64, TOK.pad_token_id, TOK.eos_token_id)

    def rest(self, sync_follows=False):
        self.rested += 1

    def agree(self, more):
        return more


def loops_file(tmp_path, entries: str) -> str:
    p = tmp_path / "loops.yaml"
    p.write_text(entries)
    return str(p)


ENTRIES = f"""\
- name: single
  _target_: {HERE}.SingleTurn
- name: retry
  _target_: {HERE}.Retry
- name: unscored
  _target_: {HERE}.Retry
  scored: false
- name: raises
  _target_: {HERE}.Raises
- name: bad_mask
  _target_: {HERE}.BadMask
"""


def config(path, default="single_turn_agent", *extra):
    return parse_overrides(
        [
            "actor_rollout_ref.model.path=/no/model",
            "data.max_prompt_length=16",
            "data.max_response_length=32",
            f"actor_rollout_ref.rollout.agent.default_agent_loop={default}",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
            *extra,
        ]
    )


def row(q: str, agent: str | None = None, index: int = 0) -> dict:
    r = {
        "prompt": [{"role": "user", "content": q}],
        "input_ids": ids(q),
        "data_source": "test",
        "reward_model": {"ground_truth": "1"},
        "extra_info": {"index": index},
    }
    return {**r, "agent_name": agent} if agent else r


@pytest.fixture(autouse=True, scope="module")
def registered_here_only():
    """@register's registry is the process's: this module's loop leaves it when the module's tests end."""
    yield
    own_loops.verl_api._agent_loop_registry.pop("retry", None)


@pytest.fixture
def entries(tmp_path):
    return loops_file(tmp_path, ENTRIES)


def test_a_verl_single_turn_loop_runs_as_rlrigs_own(entries):
    engine = Engine()
    agent = AgentRollout(engine, TOK, config(entries, "single"))
    ro, turns = agent.generate([row("12*3="), row("4*5=")], 2)
    assert engine.calls == [(4, 1, 32)]  # four samples, one engine call
    assert engine.rested == 1
    for i, q in enumerate(["12*3=", "12*3=", "4*5=", "4*5="]):
        resp = ro.input_ids[i, ro.prompt_len :][ro.attention_mask[i, ro.prompt_len :].bool()].tolist()
        assert TOK.decode(resp) == f"#### {len(ids(q))}{EOS}"
        assert ro.response_mask[i].sum() == len(resp)  # all the model's
    assert ro.engine_logp is None  # the engine reported none, so the loop returned none
    assert [r["num_turns"] for r in turns.records()] == [2] * 4


def test_masks_scores_turns_and_extra_fields_reach_the_rollout_and_the_scorer(entries):
    engine = Engine()
    agent = AgentRollout(engine, TOK, config(entries, "retry"))
    rows = [row("3+4=", index=7), row("5+5=", agent="unscored", index=8)]
    ro, turns = agent.generate(rows, 3)
    assert len(engine.calls) == 2  # six loops of two turns each: one engine call per turn
    delta = Deltas(TOK, {})([{"role": "user", "content": "again"}])  # as the template writes the user's turn
    for i in range(6):
        attended = ro.attention_mask[i, ro.prompt_len :].bool()
        resp = ro.input_ids[i, ro.prompt_len :][attended].tolist()
        mask = ro.response_mask[i][attended].tolist()
        first = ids(f"#### {len(ids(rows[i // 3]['prompt'][0]['content']))}{EOS}")
        second = ids(f"#### {len(ids(rows[i // 3]['prompt'][0]['content'])) + len(first) + len(delta)}{EOS}")
        assert resp == first + delta + second
        assert mask == [1] * len(first) + [0] * len(delta) + [1] * len(second)  # the verdict is not trained on
    info = turns.extra_info()
    assert [i.get(LOOP_SCORE) for i in info] == [0.75] * 3 + [None] * 3
    assert [i["index_seen"] for i in info] == [7] * 3 + [8] * 3
    assert all(i["num_turns"] == 4 for i in info)
    assert turns.metrics()["timing_s/agent_loop/generate_sequences/mean"] == 0.5

    seen = []

    def fn(data_source, solution_str, ground_truth, extra_info):
        seen.append(extra_info)
        return 0.25

    src = RewardSource(fn, None, None, "prompt", None)
    scores, _, _ = score(TOK, src, rows, ro, 3, info)
    assert scores.tolist() == [0.75] * 3 + [0.25] * 3  # the loop's own score stands; the function scores the rest
    assert len(seen) == 3 and all(e["index_seen"] == 8 and e["num_turns"] == 4 for e in seen)
    assert all(LOOP_SCORE not in e for e in seen)


def test_rlrigs_loops_and_loops_of_your_own_share_a_batch_in_row_order(entries):
    engine = Engine()
    agent = AgentRollout(engine, TOK, config(entries))
    rows = [row("1+1="), row("2+2=", agent="retry"), row("3+3=", agent="single"), row("4+4=")]
    ro, turns = agent.generate(rows, 2)
    assert [t.num_turns for t in turns.trajs] == [2, 2, 4, 4, 2, 2, 2, 2]
    assert [i.get(LOOP_SCORE) for i in turns.extra_info()] == [None, None, 0.75, 0.75, None, None, None, None]
    assert ro.input_ids.shape[0] == 8


@pytest.mark.parametrize(
    "default, agent_names, runs",
    [
        ("single_turn_agent", [None, "retry"], ["SingleTurnAgentLoop", "retry"]),
        ("retry", [None, "single_turn_agent"], ["retry", "SingleTurnAgentLoop"]),
        ("unscored", [None, None], ["unscored", "unscored"]),
    ],
)
def test_default_agent_loop_and_a_rows_agent_name_choose_the_loop(entries, default, agent_names, runs):
    agent = AgentRollout(Engine(), TOK, config(entries, default))
    _, turns = agent.generate([row("1+2=", a) for a in agent_names], 1)
    assert [getattr(t, "loop_name", "") or "SingleTurnAgentLoop" for t in turns.trajs] == runs


def test_a_config_entry_may_replace_a_built_in_loop_as_in_verl(tmp_path):
    path = loops_file(tmp_path, f"- name: single_turn_agent\n  _target_: {HERE}.Retry\n")
    _, turns = AgentRollout(Engine(), TOK, config(path)).generate([row("1+2=")], 1)
    assert turns.trajs[0].num_turns == 4


def test_register_names_a_loop_without_a_config_file():
    table = loop_table(None)
    assert table["retry"][0] is Retry


@pytest.mark.parametrize(
    "entries, rows, default, message",
    [
        (ENTRIES, [row("1=", "nope")], "single_turn_agent", "agent_name=nope in the data: no agent loop of that name"),
        (ENTRIES, [row("1=")], "nope", "rollout.agent.default_agent_loop=nope: no agent loop of that name"),
        ("- name: x\n  _target_: no_such_module.Loop\n", [row("1=")], "x", "agent loop x: its _target_="),
        (f"- name: x\n  _target_: {HERE}.Missing\n", [row("1=")], "x", f"agent loop x: module {HERE} has no class"),
        (f"- name: x\n  _target_: {HERE}.NotALoop\n", [row("1=")], "x", "agent loop x: " + HERE + ".NotALoop is not"),
        ("- name: x\n  _target_: Loop\n", [row("1=")], "x", "agent loop x: _target_ must be a module path"),
        ("name: x\n", [row("1=")], "x", "expected a YAML list of entries with `name` and `_target_`"),
        ("- [unclosed\n", [row("1=")], "x", "not YAML"),
    ],
)
def test_bad_loops_are_refused_at_start_in_one_line(tmp_path, entries, rows, default, message):
    cfg = config(loops_file(tmp_path, entries), default)
    with pytest.raises(ConfigError) as e:
        check(cfg, rows)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_missing_loops_file_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="agent_loop_config_path=.*: no such file"):
        check(config(tmp_path / "none.yaml"), [row("1=")])


@pytest.mark.parametrize(
    "loop, message",
    [
        ("raises", f"agent loop raises ({HERE}.Raises) raised KeyError: 'no_such_column' at "),
        ("bad_mask", "agent loop bad_mask returned response_ids of 2 tokens and response_mask 1"),
    ],
)
def test_a_failing_loop_fails_the_rollout_in_one_line_naming_it(entries, loop, message):
    agent = AgentRollout(Engine(), TOK, config(entries, loop))
    with pytest.raises(OwnLoopError) as e:
        agent.generate([row("1+2="), row("2+2=")], 2)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_loops_waiting_on_something_else_are_waited_for_before_the_engine_call():
    """A loop that awaits (a tool, a sleep) between its calls still joins one engine call with the others."""
    from rlrig.trainer.agent.server_manager import ServerManager
    from rlrig.trainer.rollout.engines.base import Sampling

    engine = Engine()

    async def one(manager, delay):
        await asyncio.sleep(delay)
        out = await manager.generate(prompt_ids=ids("1="), sampling_params={"temperature": 1.0})
        return out.token_ids

    async def main():
        manager = ServerManager(engine, Sampling(), 8, own_loops.sampling_of)
        return await manager.drive([one(manager, d) for d in (0.0, 0.02, 0.05)])

    outs = asyncio.run(main())
    assert engine.calls == [(3, 1, 8)] and outs == [ids(f"#### 2{EOS}")] * 3


def test_calls_with_different_samplings_go_to_the_engine_apart_each_cut_to_its_max_tokens():
    from rlrig.trainer.agent.server_manager import ServerManager
    from rlrig.trainer.rollout.engines.base import Sampling

    engine = Engine()

    async def one(manager, params):
        out = await manager.generate(prompt_ids=ids("12="), sampling_params=params)
        return out.token_ids

    async def main():
        manager = ServerManager(engine, Sampling(), 32, own_loops.sampling_of)
        asks = [{"temperature": 1.0, "max_tokens": 3}, {"temperature": 0.0}, {"temperature": 1.0, "max_tokens": 5}]
        return await manager.drive([one(manager, p) for p in asks])

    outs = asyncio.run(main())
    assert engine.calls == [(2, 1, 5), (1, 1, 32)]  # by sampling, in the order they came; the widest max_tokens
    whole = ids(f"#### 3{EOS}")
    assert outs == [whole[:3], whole, whole[:5]]


@pytest.mark.parametrize(
    "params, sampling",
    [
        ({"temperature": 0.0}, (0.0, 1.0, -1, False)),
        ({"temperature": 0.7, "top_p": 0.9, "top_k": 5}, (0.7, 0.9, 5, True)),
        ({}, (1.0, 1.0, -1, True)),
    ],
)
def test_a_loops_sampling_params_become_the_engines_sampling(params, sampling):
    from rlrig.trainer.rollout.engines.base import Sampling

    s = own_loops.sampling_of(params, Sampling())
    assert (s.temperature, s.top_p, s.top_k, s.do_sample) == sampling


def test_engine_log_probs_reach_a_loop_and_its_sample(entries):
    class WithLogps(Engine):
        def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
            ro = super().generate(prompts, n, sampling, sync_follows, max_new, hold)
            ro.engine_logp = -0.5 * ro.response_mask.float()
            return ro

    ro, _ = AgentRollout(WithLogps(), TOK, config(entries, "single")).generate([row("1+2=")], 1)
    assert torch.equal(ro.engine_logp, -0.5 * ro.response_mask.float())


def test_verls_own_single_turn_loop_runs_unchanged_beside_verl(tmp_path):
    """verl 0.9.1's SingleTurnAgentLoop itself, subclassing verl's AgentLoopBase, named in the config file: it gets
    verl's constructor arguments and server manager and its sample reaches the rollout (needs verl installed)."""
    pytest.importorskip("verl.experimental.agent_loop.single_turn_agent_loop")
    target = "verl.experimental.agent_loop.single_turn_agent_loop.SingleTurnAgentLoop"
    path = loops_file(tmp_path, f"- name: verl_single\n  _target_: {target}\n")
    engine = Engine()
    ro, turns = AgentRollout(engine, TOK, config(path, "verl_single")).generate([row("12*3="), row("4*5=")], 2)
    assert engine.calls == [(4, 1, 32)]
    for i, q in enumerate(["12*3=", "12*3=", "4*5=", "4*5="]):
        attended = ro.attention_mask[i, ro.prompt_len :].bool()
        resp = ro.input_ids[i, ro.prompt_len :][attended].tolist()
        assert TOK.decode(resp) == f"#### {len(ids(q))}{EOS}"
        assert ro.response_mask[i][attended].tolist() == [1] * len(resp)
    assert [t.num_turns for t in turns.trajs] == [2] * 4
    assert all(i["turn_scores"] == [] and i["tool_rewards"] == [] for i in turns.extra_info())


VERL_RETRY = '''
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput


class VerlRetry(AgentLoopBase):
    """Held out: written for verl 0.9.1 alone, with verl's own token bookkeeping between two turns."""

    async def run(self, sampling_params, **kwargs):
        messages = list(kwargs["raw_prompt"])
        prompt_ids = await self.ct_build_initial_tokens(messages)
        ids, mask, logps = list(prompt_ids), [], []
        for turn in range(2):
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=ids, sampling_params=sampling_params
            )
            merged, mask, logps = await self.ct_merge_assistant_token(
                ids, out.token_ids, mask, logps, [0.0] * len(out.token_ids)
            )
            ids = merged.token_ids
            text = self.tokenizer.decode(out.token_ids, skip_special_tokens=True)
            messages.append({"role": "assistant", "content": text})
            if turn == 0:
                updated = messages + [{"role": "user", "content": "again"}]
                merged, mask, logps = await self.ct_merge_context_msg(messages, updated, ids, mask, logps)
                ids, messages = merged.token_ids, updated
        return AgentLoopOutput(
            prompt_ids=prompt_ids, response_ids=ids[len(prompt_ids):], response_mask=mask, response_logprobs=logps,
            reward_score=1.0, num_turns=4, metrics={}, extra_fields={"raw": kwargs["raw_prompt"][0]["content"]},
        )
'''


def test_a_multi_turn_loop_written_for_verl_runs_unchanged_beside_verl(tmp_path, monkeypatch):
    """A loop importing only verl (verl's AgentLoopBase and its continuous-token helpers), named in the config file:
    its two turns, the masked user turn between them, its score and its extra fields (needs verl installed)."""
    pytest.importorskip("verl.experimental.agent_loop.agent_loop")
    (tmp_path / "verl_retry.py").write_text(VERL_RETRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    path = loops_file(tmp_path, "- name: verl_retry\n  _target_: verl_retry.VerlRetry\n")
    engine = Engine()
    ro, turns = AgentRollout(engine, TOK, config(path, "verl_retry")).generate([row("3+4="), row("5+5=")], 2)
    assert len(engine.calls) == 2  # four loops, two turns: an engine call a turn
    for i in range(4):
        attended = ro.attention_mask[i, ro.prompt_len :].bool()
        mask = ro.response_mask[i][attended].tolist()
        first = len(ids(f"#### 4{EOS}"))
        assert mask[:first] == [1] * first and mask[first] == 0 and mask[-1] == 1
        assert 0 < mask.count(0) < len(mask) - first
    info = turns.extra_info()
    assert [i[LOOP_SCORE] for i in info] == [1.0] * 4 and [i["raw"] for i in info] == ["3+4="] * 2 + ["5+5="] * 2
    assert [t.num_turns for t in turns.trajs] == [4] * 4
