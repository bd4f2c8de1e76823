"""verl's tool agent loop over a batched engine: turns, masks, limits, tool errors and interactions, each as verl's
loop gives them (its tests' turn counts: no call 2, one tool round 4, an interaction's reply 3). The engine here
is scripted (a context's text -> the next turn's text) over the embedded tool model's real tokenizer; the engines
themselves are tested against the real backends elsewhere."""

import asyncio
import json

import pytest
import torch

from rlrig.trainer.agent.chat import Deltas, default_system_prefix
from rlrig.trainer.agent.interactions.base import BaseInteraction
from rlrig.trainer.agent.loop import SINGLE_TURN, TOOL_AGENT, LoopLimits, ToolAgentLoop, truncated
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.agent.tool_parser import FunctionCall, hermes
from rlrig.trainer.agent.tools.base import BaseTool, ToolResponse
from rlrig.trainer.agent.tools.calculator import CalculatorTool
from rlrig.trainer.embedded.tool_model import CALL_CLOSE, CALL_OPEN, build_tool_tokenizer
from rlrig.trainer.rollout.engines.base import pack_responses


@pytest.mark.parametrize(
    "text, calls",
    [
        ("no call here", []),
        ('<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', [FunctionCall("f", '{"x": 1}')]),
        (
            '<tool_call>{"name": "f", "arguments": {}}</tool_call> and '
            '<tool_call>{"name": "g", "arguments": "s"}</tool_call>',
            [FunctionCall("f", "{}"), FunctionCall("g", '"s"')],
        ),
        ('<tool_call>{"name": "f", "arguments": {}}', []),  # unclosed: no call
        ('<tool_call>{"name": "f"}</tool_call>', []),  # no arguments: skipped, as verl
        ("<tool_call>not json</tool_call>", []),
    ],
)
def test_hermes_reads_verls_format(text, calls):
    assert hermes(text) == calls


@pytest.mark.parametrize(
    "side, expected",
    [
        ("left", "abcd...(truncated)"),  # verl's names: left keeps the start
        ("right", "(truncated)...ghij"),
        ("middle", "ab...(truncated)...ij"),
        ("anything", "ab...(truncated)...ij"),
    ],
)
def test_long_tool_responses_are_cut_as_verl_cuts_them(side, expected):
    assert truncated("abcdefghij", 4, side) == expected
    assert truncated("abcd", 4, side) == "abcd"


TOK = build_tool_tokenizer()
EOS = TOK.eos_token


def call(expression: str) -> str:
    return f"<tool_call>{CALL_OPEN}{expression}{CALL_CLOSE}</tool_call>{EOS}"


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


class ScriptedEngine:
    """The rollout engine's interface, answering each context (its text) from a script: the longest key the context
    ends with gives the turn."""

    def __init__(self, script: dict[str, str]):
        self.script, self.calls, self.rested = script, [], 0

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        assert hold
        self.calls.append((len(prompts), n, max_new))
        turns = []
        for p in prompts:
            text = TOK.decode(p, skip_special_tokens=False)
            key = max((k for k in self.script if text.endswith(k)), key=len)
            turns += [ids(self.script[key])] * n
        return pack_responses(prompts, n, turns, None, max_new or 64, TOK.pad_token_id, TOK.eos_token_id)

    def rest(self, sync_follows=False):
        self.rested += 1

    def agree(self, more):
        return more


class Cfg:
    """The config keys the loop reads."""

    def __init__(self, tool_config=None, interaction_config=None, response_length=64, **multi_turn):
        mt = dict(
            tokenization_sanity_check_mode="strict",
            max_assistant_turns=None,
            max_user_turns=None,
            max_parallel_calls=1,
            max_tool_response_length=256,
            tool_response_truncate_side="middle",
            tool_timeout=5.0,
            format="hermes",
            tool_config_path=tool_config,
            interaction_config_path=interaction_config,
        )
        mt.update(multi_turn)
        ns = type("NS", (), {})
        self.actor_rollout_ref = ns()
        self.actor_rollout_ref.rollout = ns()
        self.actor_rollout_ref.rollout.multi_turn = type("MT", (), mt)()
        agent = {"default_agent_loop": TOOL_AGENT, "agent_loop_config_path": None}
        self.actor_rollout_ref.rollout.agent = type("AG", (), agent)()
        self.actor_rollout_ref.rollout.trace = type("TR", (), dict(backend=None, token2text=False))()
        self.actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker = None
        self.trainer = type("T", (), {"project_name": "rlrig", "experiment_name": "default"})()
        self.data = type("D", (), {"max_response_length": response_length, "apply_chat_template_kwargs": {}})()
        self.data.tool_config_path = tool_config  # the prompts' tools (row() below templates them so)
        self.data.prompt_key = "prompt"


@pytest.fixture
def calc_config(tmp_path):
    p = tmp_path / "tools.yaml"
    p.write_text(
        "tools:\n  - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool\n    config: {type: native}\n"
    )
    return str(p)


def row(q: str, agent=TOOL_AGENT, prompt=None, **extra):
    return {
        "prompt": [{"role": "user", "content": q}],
        "input_ids": ids(prompt if prompt is not None else f"<tools>{q}"),  # as the chat template makes it with tools
        "agent_name": agent,
        "extra_info": extra,
    }


def decode_parts(ro, i):
    """(the response's text, the model's text alone) of sample i."""
    resp = ro.input_ids[i, ro.prompt_len :]
    seen = ro.attention_mask[i, ro.prompt_len :].bool()
    own = ro.response_mask[i].bool()
    return TOK.decode(resp[seen], skip_special_tokens=False), TOK.decode(resp[own], skip_special_tokens=False)


def test_a_tool_round_puts_the_tools_answer_in_the_response_with_mask_zero(calc_config):
    engine = ScriptedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"})
    ro, stats = AgentRollout(engine, TOK, Cfg(calc_config)).generate([row("12*3=")], 2)
    for i in range(2):
        whole, own = decode_parts(ro, i)
        assert whole == call("12*3") + "<tool_response>36</tool_response>" + f"#### 36{EOS}"
        assert own == call("12*3") + f"#### 36{EOS}"
    assert [t.num_turns for t in stats.trajs] == [4, 4]  # prompt, call, tool round, answer
    assert [t.tool_calls for t in stats.trajs] == [1, 1]
    assert engine.calls[0] == (1, 2, None)  # the first turn: the prompt's n samples in one call
    assert engine.calls[1][:2] == (2, 1)  # then each trajectory's own context
    assert engine.rested == 1 and ro.engine_logp is None  # the scripted engine reports no log-probs


def test_a_turn_without_a_call_ends_the_sample_and_single_turn_rows_never_call(calc_config):
    engine = ScriptedEngine({"5*5=": f"#### 25{EOS}", "6*6=": call("6*6")})
    rows = [row("5*5="), row("6*6=", agent=SINGLE_TURN)]
    ro, stats = AgentRollout(engine, TOK, Cfg(calc_config)).generate(rows, 1)
    assert [t.num_turns for t in stats.trajs] == [2, 2]
    assert decode_parts(ro, 1)[0] == call("6*6")  # its call is text: single_turn_agent runs no tools
    assert len(engine.calls) == 1


@pytest.mark.parametrize(
    "limits, turns",
    [
        ({}, 6),  # call, tool, call, tool, answer
        ({"max_assistant_turns": 2}, 4),  # stops after the second generation, its call not run
        ({"max_user_turns": 1}, 4),  # gen, tool round, gen, stop
        ({"max_assistant_turns": 1}, 2),
    ],
)
def test_turn_limits_are_checked_after_each_generation_as_verl(calc_config, limits, turns):
    engine = ScriptedEngine(
        {"9*9=": call("9*9"), "81</tool_response>": call("81+1"), "82</tool_response>": f"#### 82{EOS}"}
    )
    _, stats = AgentRollout(engine, TOK, Cfg(calc_config, **limits)).generate([row("9*9=")], 1)
    assert stats.trajs[0].num_turns == turns


def test_a_tool_response_that_would_not_fit_ends_the_sample_unappended(calc_config):
    turn = call("11*11")
    engine = ScriptedEngine({"11*11=": turn, "</tool_response>": f"#### 121{EOS}"})
    room = len(ids(turn)) + 3  # less than the tool's delta
    ro, stats = AgentRollout(engine, TOK, Cfg(calc_config, response_length=room)).generate([row("11*11=")], 1)
    t = stats.trajs[0]
    assert t.num_turns == 2 and t.tool_calls == 1 and t.ids == ids(turn)
    assert decode_parts(ro, 0)[0] == turn


def test_responses_are_cut_to_the_response_length(calc_config):
    engine = ScriptedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"})
    full = len(ids(call("12*3") + "<tool_response>36</tool_response>"))
    ro, _ = AgentRollout(engine, TOK, Cfg(calc_config, response_length=full + 3)).generate([row("12*3=")], 1)
    assert ro.response_mask.shape[1] == full + 3
    assert decode_parts(ro, 0)[0].endswith("</tool_response>###")  # verl's final cut, mid-turn
    assert engine.calls[1][2] == 3  # the last turn was asked for no more than the room left


class Slow(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        await asyncio.sleep(10)
        return ToolResponse(text="late"), 0.0, {}


class Raising(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("disk on fire")


SCHEMA = {
    "type": "function",
    "function": {"name": "", "description": "", "parameters": {"type": "object", "properties": {}, "required": []}},
}


def named(cls, name):
    s = json.loads(json.dumps(SCHEMA))
    s["function"]["name"] = name
    return cls({"type": "native"}, s)


@pytest.mark.parametrize(
    "turn, reply",
    [
        ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>', "Error when executing tool: 'nope'"),
        (
            '<tool_call>{"name": "calculator", "arguments": {"expression": "1+"}}</tool_call>',
            "Error when executing tool: not an expression: '1+'",
        ),
        (
            '<tool_call>{"name": "slow", "arguments": {}}</tool_call>',
            "Error when executing tool: timed out after 0.2 s",
        ),
        ('<tool_call>{"name": "raising", "arguments": {}}</tool_call>', "Error when executing tool: disk on fire"),
    ],
)
def test_a_failing_call_comes_back_to_the_model_as_text(turn, reply):
    tools = {
        "calculator": CalculatorTool({"type": "native"}),
        "slow": named(Slow, "slow"),
        "raising": named(Raising, "raising"),
    }
    limits = LoopLimits(None, None, 1, 256, "middle", 0.2, 64)
    loop = ToolAgentLoop(TOK, limits, hermes, tools, {}, {})
    [t] = loop.start([row("1=")], 1, [TOOL_AGENT], "prompt")
    t.calls = hermes(turn)  # (the tool model's tokenizer spells digits and operators only)
    loop.run_tools([t])
    assert t.messages[-1] == {"role": "tool", "content": reply} and t.tool_rewards == [0.0]
    assert not t.done and t.user_turns == 1


def test_only_the_first_max_parallel_calls_of_a_turn_run(calc_config):
    two = call("1+1")[: -len(EOS)] + call("2+2")
    engine = ScriptedEngine({"2+2=": two, "</tool_response>": f"#### 2{EOS}"})
    for parallel, replies in ((1, ["2"]), (2, ["2", "4"])):
        agent = AgentRollout(engine, TOK, Cfg(calc_config, max_parallel_calls=parallel))
        _, stats = agent.generate([row("2+2=")], 1)
        t = stats.trajs[0]
        assert [m["content"] for m in t.messages if m["role"] == "tool"] == replies
        assert t.num_turns == 4  # one tool round is one user turn, however many calls


class Teacher(BaseInteraction):
    """Says "0." (no) until the model answers 7, then "1." (yes) and ends the conversation."""

    async def generate_response(self, instance_id, messages, **kwargs):
        right = messages[-1]["content"].endswith("7")
        return right, ("1." if right else "0."), float(right), {}


def test_an_interaction_answers_turns_without_calls_until_it_ends_the_conversation(calc_config):
    engine = ScriptedEngine({"3+3=": f"#### 6{EOS}", "0.": f"#### 7{EOS}"})
    agent = AgentRollout(engine, TOK, Cfg(calc_config))
    agent.loop.interactions = {"teacher": Teacher({"name": "teacher"})}
    ro, stats = agent.generate([row("3+3=", interaction_kwargs={"name": "teacher"})], 1)
    t = stats.trajs[0]
    assert t.num_turns == 5 and t.turn_scores == [0.0, 1.0] and t.user_turns == 2
    whole, own = decode_parts(ro, 0)
    assert whole == f"#### 6{EOS}0.#### 7{EOS}1." and own == f"#### 6{EOS}#### 7{EOS}"
    assert t.info() == {"turn_scores": [0.0, 1.0], "tool_rewards": [], "num_turns": 5}


def test_tool_deltas_leave_out_the_templates_default_system_block():
    """The tool model's template has none; a Qwen-like one that opens with a default system prompt would repeat it
    in every delta without the cut."""
    assert default_system_prefix(TOK) == []
    assert TOK.decode(Deltas(TOK, {})([{"role": "tool", "content": "42"}])) == "<tool_response>42</tool_response>"
    qwenish = build_tool_tokenizer()
    qwenish.chat_template = "{% if messages[0]['role'] != 'system' %}###{% endif %}" + qwenish.chat_template
    assert qwenish.decode(default_system_prefix(qwenish)) == "###"
    assert (
        qwenish.decode(Deltas(qwenish, {})([{"role": "tool", "content": "42"}])) == "<tool_response>42</tool_response>"
    )


def test_pack_lays_out_prompt_response_attention_and_model_masks():
    engine = ScriptedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}", "1=": f"#### 1{EOS}"})
    ro, stats = AgentRollout(engine, TOK, Cfg(None)).generate([row("12*3="), row("1=", agent=SINGLE_TURN)], 1)
    t = stats.trajs[0]
    R = ro.response_mask.shape[1]
    assert ro.attention_mask[0, ro.prompt_len :].tolist() == [1] * len(t.ids) + [0] * (R - len(t.ids))
    assert ro.response_mask[0].tolist() == t.mask + [0] * (R - len(t.mask))
    assert 0 in t.mask[: len(t.mask) - 2] and t.mask[-1] == 1  # a hole where the tool spoke, the answer after it
    # no tools configured: the call's reply is verl's error text for an unknown tool
    assert stats.trajs[0].messages[-2]["content"] == "Error when executing tool: 'calculator'"  # before the answer
    assert torch.equal(ro.response_mask[1], ro.attention_mask[1, ro.prompt_len :])  # one turn: the two agree


CHECKED = "inconsistent training and inference tokenization"


@pytest.mark.parametrize(
    "script, response_length",
    [
        ({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"}, 64),  # a tool round, then the answer
        ({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"}, 20),  # the answer cut by the response length
        ({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"}, 12),  # the tool's reply left out: no room
        ({"12*3=": f"#### 36{EOS}"}, 64),  # one turn
    ],
)
def test_samples_whose_turns_the_template_makes_pass_the_strict_sanity_check(
    calc_config, capsys, script, response_length
):
    rollout = AgentRollout(ScriptedEngine(script), TOK, Cfg(calc_config, response_length=response_length))
    _, stats = rollout.generate([row("12*3=")], 2)
    assert [m["role"] for m in stats.trajs[0].messages][:2] == ["user", "assistant"]
    assert CHECKED not in capsys.readouterr().err
    assert rollout.loop.check([(t.prompt + t.ids, t.messages) for t in stats.trajs]) == 0


@pytest.mark.parametrize(
    "prompt, mode, warned",
    [
        ("12*3=", "strict", True),  # the prompt made without its tools: "<tools>" missing
        ("12*3=", "ignore_strippable", True),
        ("<tools> 12*3=", "strict", True),  # a space the template does not write
        ("<tools> 12*3=", "ignore_strippable", False),
        ("<tools> 12*3=", "disable", False),
        ("<tools>12*3=", "strict", False),
    ],
)
def test_a_sample_whose_tokens_the_template_would_not_make_is_reported_by_mode(
    calc_config, capsys, prompt, mode, warned
):
    engine = ScriptedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"})
    cfg = Cfg(calc_config, tokenization_sanity_check_mode=mode)
    AgentRollout(engine, TOK, cfg).generate([row("12*3=", prompt=prompt), row("12*3=")], 2)
    err = capsys.readouterr().err
    assert (CHECKED in err) == warned
    if warned:
        assert f"({mode}) in 2 of 4 multi-turn samples" in err  # the two templated right pass
        assert "full_prompt_chunk: '<tools>" in err or "current_prompt_chunk: '<tools> " in err
