"""An agent written with the `openai` package drives a scripted engine through rlrig's OpenAI-compatible endpoint:
its samples are the engine's own tokens (trained on) and what the agent added (masked), stitched call by call; an
agent that raises, hangs, returns no number or asks past the response budget ends its sample only, counted; keys,
the entry's keys and the request's limits are checked."""

import asyncio

import pytest
import torch

from rlrig.trainer.agent.chat import Deltas, template_ids
from rlrig.trainer.agent.openai_demo import CALCULATOR
from rlrig.trainer.agent.openai_tokens import SampleTokens
from rlrig.trainer.agent.rollout import AgentRollout, turn_metrics
from rlrig.trainer.agent.setup import check
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.embedded.tool_model import CALL_CLOSE, CALL_OPEN, build_tool_tokenizer
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward.scoring import LOOP_SCORE
from rlrig.trainer.rollout.engines.base import pack_responses

openai = pytest.importorskip("openai")  # the test extra installs it

TOK = build_tool_tokenizer()
EOS = TOK.eos_token
HERE = __name__


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


# --- the token bookkeeping, call by call ---

P, A, B, C, E = [1, 2], [3, 4], [5, 6], [7], [8, 9]


@pytest.mark.parametrize(
    "calls, prompt, response, mask",
    [
        # one call: its completion, all the model's
        ([(P, A)], P, A, [1, 1]),
        # the follow-up carries the completion as it came, then the agent's tokens: those masked
        ([(P, A), (P + A + E, B)], P, A + E + B, [1, 1, 0, 0, 1, 1]),
        # a follow-up that is the context exactly: the model goes on
        ([(P, A), (P + A, B)], P, A + B, [1, 1, 1, 1]),
        # the template re-rendered the model's turn: from where it differs, the rendering (masked)
        ([(P, A), (P + [3] + E, B)], P, [3] + E + B, [1, 0, 0, 1, 1]),
        # the agent dropped the model's turn altogether
        ([(P, A), (P + E, B)], P, E + B, [0, 0, 1, 1]),
        # three calls
        ([(P, A), (P + A + E, B), (P + A + E + B + C, A)], P, A + E + B + C + A, [1, 1, 0, 0, 1, 1, 0, 1, 1]),
        # the agent rewrote the question: the sample starts over from that call
        ([(P, A), ([9] + P, B)], [9] + P, B, [1, 1]),
    ],
)
def test_calls_are_stitched_into_one_sample(calls, prompt, response, mask):
    t = SampleTokens()
    for i, (p, completion) in enumerate(calls):
        t.add(p, completion, [-0.1 * (i + 1)] * len(completion))
    assert (t.prompt, t.ids, t.mask) == (prompt, response, mask)
    assert len(t.logps) == len(t.ids) and all((lp != 0) == bool(m) for lp, m in zip(t.logps, t.mask))
    assert t.calls == len(calls) and t.with_logps


@pytest.mark.parametrize(
    "calls, next_prompt, room",
    [
        ([], P, 10),
        ([(P, A)], P + A + E, 10 - 4),
        ([(P, A)], P + [3] + E, 10 - 3),
        ([(P, A)], [9], 10),  # a new start
        ([(P, [3] * 9)], P + [3] * 9 + E, -1),
    ],
)
def test_the_room_left_in_the_response_budget(calls, next_prompt, room):
    t = SampleTokens()
    for p, completion in calls:
        t.add(p, completion, None)
    assert t.room(next_prompt, 10) == room
    assert t.with_logps == (not calls)


# --- the endpoint over a scripted engine ---


class Engine:
    """Calls the calculator where the context has no tool response yet, else answers what the response said (or, for
    a prompt without tools, `#### 7`); every call's new tokens recorded."""

    def __init__(self, logps: bool = False):
        self.calls, self.written, self.logps = [], [], logps

    def turn(self, prompt: list[int]) -> list[int]:
        text = TOK.decode(prompt)
        if "<tool_response>" in text:
            return ids(f"#### {text.split('<tool_response>')[-1].split('</tool_response>')[0]}{EOS}")
        if text.startswith("<tools>"):
            return ids(f"<tool_call>{CALL_OPEN}{text[len('<tools>') : -1]}{CALL_CLOSE}</tool_call>{EOS}")
        return ids(f"#### 7{EOS}")

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        self.calls.append(len(prompts))
        turns = [self.turn(p)[: max_new or 64] for p in prompts for _ in range(n)]
        self.written += [(list(p), t) for p, t in zip(prompts, turns)]
        logps = [[-0.25] * len(t) for t in turns] if self.logps else None
        return pack_responses(prompts, n, turns, logps, max_new or 64, TOK.pad_token_id, TOK.eos_token_id)

    def rest(self, sync_follows=False):
        pass

    def agree(self, more):
        return more


def loops_file(tmp_path, agent: str, **keys) -> str:
    p = tmp_path / "loops.yaml"
    extra = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    p.write_text(
        f"- name: agent\n  _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop\n  agent: {agent}\n{extra}"
    )
    return str(p)


def config(path, *extra):
    return parse_overrides(
        [
            "actor_rollout_ref.model.path=/no/model",
            "data.max_prompt_length=16",
            "data.max_response_length=48",
            "actor_rollout_ref.rollout.agent.default_agent_loop=agent",
            f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}",
            *extra,
        ]
    )


def row(a: int, b: int, **extra) -> dict:
    q = f"{a}*{b}="
    return {
        "prompt": [{"role": "user", "content": q}],
        "input_ids": ids(q),
        "data_source": "rlrig/calculator",
        "reward_model": {"ground_truth": str(a * b)},
        "extra_info": {"index": a, **extra},
    }


def sample(ro, i: int) -> tuple[list[int], list[int], list[int]]:
    """Row i's prompt, response and response mask, without padding."""
    prompt = ro.input_ids[i, : ro.prompt_len][ro.attention_mask[i, : ro.prompt_len].bool()].tolist()
    attended = ro.attention_mask[i, ro.prompt_len :].bool()
    return prompt, ro.input_ids[i, ro.prompt_len :][attended].tolist(), ro.response_mask[i][attended].tolist()


def test_an_openai_client_agent_trains_on_the_engines_own_tokens(tmp_path):
    engine = Engine(logps=True)
    agent = AgentRollout(engine, TOK, config(loops_file(tmp_path, "rlrig.trainer.agent.openai_demo:solve")))
    rows = [row(12, 34), row(56, 78)]
    ro, turns = agent.generate(rows, 2)
    assert engine.calls == [4, 4]  # four agents, two turns each: one engine call per turn
    for i, r in enumerate(rows[i // 2] for i in range(4)):
        prompt, response, mask = sample(ro, i)
        assert prompt == template_ids(TOK, r["prompt"], {}, [CALCULATOR])  # `<tools>` and the question
        # what the engine wrote for this row's samples (the two alike): its call, then its answer
        written = [(p, t) for p, t in engine.written if p[: len(prompt)] == prompt]
        (p1, call), (p2, answer) = [w for k, w in enumerate(written) if w not in written[:k]]
        tool = Deltas(TOK, {})([{"role": "tool", "content": r["reward_model"]["ground_truth"]}])
        assert p1 == prompt and p2 == prompt + call + tool  # the model's call came back as it wrote it
        assert response == call + tool + answer
        assert mask == [1] * len(call) + [0] * len(tool) + [1] * len(answer)
        logp = ro.engine_logp[i][ro.attention_mask[i, ro.prompt_len :].bool()].tolist()
        assert logp == [-0.25 * m for m in mask]
    info = turns.extra_info()
    assert [i[LOOP_SCORE] for i in info] == [1.0] * 4  # the agent's own score
    assert all(i["num_turns"] == 4 and i["agent_calls"] == 2 for i in info)
    m = turns.metrics()
    assert (m["agent/openai/failed"], m["agent/openai/timed_out"], m["agent/openai/over_budget"]) == (0, 0, 0)


# agents that go wrong, one sample each; `how` in the row's extra_info picks what this one does
def unruly(base_url, api_key, row):
    how = row["extra_info"]["how"]
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    messages = list(row["messages"])
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=4)
    if how == "raises":
        raise ValueError("the agent's own bug")
    if how == "hangs":
        import time

        time.sleep(30)
    if how == "not_a_number":
        return "right"
    if how == "over_budget":
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        while True:  # asks until refused, then keeps the refusal's score
            messages.append({"role": "user", "content": "1*1="})
            try:
                reply = client.chat.completions.create(model="m", messages=messages)
            except openai.BadRequestError as e:
                assert "response budget" in str(e)
                return 0.5
            messages.append(reply.choices[0].message.model_dump(exclude_none=True))
    return None if how == "unscored" else 1.0


async def async_hangs(base_url, api_key, row):
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="m", messages=row["messages"])
    await asyncio.sleep(30)


def test_a_raising_or_hanging_agent_ends_its_sample_only(tmp_path):
    path = loops_file(tmp_path, f"{HERE}:unruly", timeout_s=2)
    file_agent = tmp_path / "agent_file.py"
    file_agent.write_text(f"from {HERE} import async_hangs\n")
    more = {"async_hangs": (f"{file_agent}:async_hangs", 2), "patient": (f"{HERE}:unruly", 30)}
    (tmp_path / "more.yaml").write_text(
        open(path).read()
        + "".join(
            f"- name: {name}\n  _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop\n"
            f"  agent: {fn}\n  timeout_s: {limit}\n"
            for name, (fn, limit) in more.items()
        )
    )
    agent = AgentRollout(Engine(), TOK, config(tmp_path / "more.yaml"))
    hows = ["fine", "raises", "hangs", "not_a_number", "over_budget", "unscored", "fine", "x"]
    # the hanging ones hold the batch's engine calls until their time is up: the one asking past its budget has more
    names = {"over_budget": "patient", "x": "async_hangs"}
    rows = [{**row(1, 1, how=h), "agent_name": names.get(h, "agent")} for h in hows]
    ro, turns = agent.generate(rows, 1)
    info = turns.extra_info()
    outcomes = [i["agent_outcome"] for i in info]
    assert outcomes == ["returned", "failed", "timed_out", "failed", "over_budget", "returned", "returned", "timed_out"]
    assert [i.get(LOOP_SCORE) for i in info] == [1.0, None, None, None, 0.5, None, 1.0, None]
    m = turns.metrics()
    assert (m["agent/openai/failed"], m["agent/openai/timed_out"], m["agent/openai/over_budget"]) == (2, 2, 1)
    # a rollout pool's samples carry their records to the trainer, which counts them the same way
    assert {k: v for k, v in turn_metrics(turns.records()).items() if k.startswith("agent/")} == {
        "agent/openai/failed": 2.0,
        "agent/openai/timed_out": 2.0,
        "agent/openai/over_budget": 1.0,
    }
    for i in range(len(rows)):  # each sample kept what its calls recorded: its first turn at least
        _, response, mask = sample(ro, i)
        assert response[: len(ids(f"#### 7{EOS}")[:4])] == ids(f"#### 7{EOS}")[:4] and mask[0] == 1
    _, response, _ = sample(ro, 4)
    assert len(response) == 48  # the budget, filled


async def two_at_once(base_url, api_key, row):
    """Sample 0 asks twice at once, while sample 1's call, made later, holds the engine call back."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    ask = lambda: client.chat.completions.create(model="m", messages=row["messages"])
    if row["extra_info"]["index"] == 1:
        await asyncio.sleep(0.5)
        await ask()
        return 1.0
    results = await asyncio.gather(ask(), ask(), return_exceptions=True)
    refused = [r for r in results if isinstance(r, openai.BadRequestError)]
    assert len(refused) == 1 and "a call in flight" in str(refused[0]), results
    return 1.0


def test_a_samples_calls_are_made_one_at_a_time(tmp_path):
    path = loops_file(tmp_path, f"{HERE}:two_at_once")
    _, turns = AgentRollout(Engine(), TOK, config(path)).generate([row(2, 3, index=0), row(2, 3, index=1)], 1)
    assert [(i["agent_outcome"], i["agent_calls"]) for i in turns.extra_info()] == [("returned", 1)] * 2


def test_the_endpoint_refuses_other_keys_and_what_it_cannot_do(tmp_path):
    seen = {}

    def probe(base_url, api_key, row):
        ask = lambda key, **kw: openai.OpenAI(base_url=base_url, api_key=key, max_retries=0).chat.completions.create(
            model="m", messages=row["messages"], **kw
        )
        for name, key, kw in [
            ("key", "not-the-key", {}),
            ("n", api_key, {"n": 2}),
            ("stop", api_key, {"stop": ["\n"]}),
            ("max_tokens", api_key, {"max_tokens": 0}),
        ]:
            try:
                ask(key, **kw)
                seen[name] = "answered"
            except openai.APIStatusError as e:
                seen[name] = (e.status_code, e.message)
        text = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).completions.create(
            model="m", prompt=TOK.decode(ids("5*5=")), max_tokens=3
        )
        seen["completion"] = (text.choices[0].text, text.choices[0].finish_reason)
        return 1.0

    import sys

    sys.modules[HERE].probe = probe
    ro, turns = AgentRollout(Engine(), TOK, config(loops_file(tmp_path, f"{HERE}:probe"))).generate([row(5, 5)], 1)
    assert seen["key"][0] == 401 and "invalid api key" in seen["key"][1]
    assert seen["n"][0] == 400 and "n must be 1" in seen["n"][1]
    assert seen["stop"][0] == 400 and "stop sequences are not supported" in seen["stop"][1]
    assert seen["max_tokens"][0] == 400 and "max_tokens must be a positive integer" in seen["max_tokens"][1]
    assert seen["completion"] == (TOK.decode(ids("#### 7")[:3]), "length")
    _, response, mask = sample(ro, 0)
    assert response == ids("#### 7")[:3] and mask == [1, 1, 1]  # the one call that reached the engine


def rewrites(base_url, api_key, row):
    """Sends back an answer other than the model's, then asks again, then continues by token ids."""
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    client.chat.completions.create(model="m", messages=row["messages"])
    edited = [*row["messages"], {"role": "assistant", "content": "#### 8"}, {"role": "user", "content": "1+1="}]
    again = client.chat.completions.create(model="m", messages=edited)
    context = template_ids(TOK, edited, {}) + ids(again.choices[0].message.content + EOS)
    client.completions.create(model="m", prompt=context + ids("2="), max_tokens=2)
    return None


def test_an_agent_that_rewrites_the_models_turn_trains_on_what_the_engine_read(tmp_path):
    import sys

    sys.modules[HERE].rewrites = rewrites
    engine = Engine()
    ro, turns = AgentRollout(engine, TOK, config(loops_file(tmp_path, f"{HERE}:rewrites"))).generate([row(5, 5)], 1)
    prompt, response, mask = sample(ro, 0)
    answer = ids(f"#### 7{EOS}")
    shared = len(ids("#### "))  # the model wrote `#### 7`, the agent sent back `#### 8`: they share `#### `
    assert prompt == ids("5*5=")
    assert [p for p, _ in engine.written][1] == template_ids(
        TOK, [*row(5, 5)["prompt"], {"role": "assistant", "content": "#### 8"}, {"role": "user", "content": "1+1="}], {}
    )
    rendered = ids(f"8{EOS}1+1=")
    assert response == answer[:shared] + rendered + answer + ids("2=") + answer[:2]
    assert mask == [1] * shared + [0] * len(rendered) + [1] * len(answer) + [0, 0] + [1, 1]
    assert turns.extra_info()[0]["agent_calls"] == 3 and LOOP_SCORE not in turns.extra_info()[0]


def test_the_outcome_counts_add_up_over_the_workers():
    from rlrig.trainer.metrics import reduce

    one = {"agent/openai/failed": 1.0, "agent/openai/timed_out": 0.0, "agent/openai/over_budget": 2.0}
    two = {"agent/openai/failed": 3.0, "agent/openai/timed_out": 1.0, "agent/openai/over_budget": 0.0}
    assert reduce([one, two]) == {
        "agent/openai/failed": 4.0,
        "agent/openai/timed_out": 1.0,
        "agent/openai/over_budget": 2.0,
    }


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            {"agent": "no_such_module_here:solve"},
            "agent loop agent: agent=no_such_module_here:solve cannot be imported (ModuleNotFoundError",
        ),
        ({"agent": f"{HERE}:nothing"}, f"agent loop agent: agent={HERE}:nothing: {HERE} has no function nothing"),
        ({"agent": "solve"}, "must name a function as module:function or path/to/file.py:function"),
        ({"agent": "/no/such/agent.py:solve"}, "no such file /no/such/agent.py"),
        ({"agent": f"{HERE}:unruly", "timeout_s": 0}, "agent loop agent: timeout_s=0 must be a positive number"),
        ({"agent": f"{HERE}:unruly", "timeout": 5}, "agent loop agent: timeout is not a key of an OpenAI agent's"),
    ],
)
def test_the_entrys_keys_are_checked_at_start_in_one_line(tmp_path, keys, message):
    p = tmp_path / "loops.yaml"
    lines = "".join(f"  {k}: {v}\n" for k, v in keys.items())
    p.write_text(f"- name: agent\n  _target_: rlrig.trainer.agent.openai_agent.OpenAIAgentLoop\n{lines}")
    with pytest.raises(ConfigError) as e:
        check(config(p), [row(1, 1)])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_a_loops_counters_survive_pydantic():
    """AgentLoopOutput keeps the loop's own metrics class, whose counters() the rollout sums."""
    from rlrig.trainer.agent.openai_agent import OpenAIAgentMetrics
    from rlrig.trainer.agent.verl_api import AgentLoopOutput

    out = AgentLoopOutput(prompt_ids=[1], response_ids=[], response_mask=[], metrics=OpenAIAgentMetrics(failed=1))
    assert out.metrics.counters() == {
        "agent/openai/failed": 1.0,
        "agent/openai/timed_out": 0.0,
        "agent/openai/over_budget": 0.0,
    }


# --- the real engine ---


class Recording:
    """An engine whose every generated token is recorded, prompt by prompt."""

    def __init__(self, engine):
        self.engine, self.written = engine, []

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        ro = self.engine.generate(prompts, n, sampling, sync_follows, max_new, hold)
        for i, p in enumerate(prompts):
            kept = ro.response_mask[i].bool()
            self.written.append((list(p), ro.input_ids[i, ro.prompt_len :][kept].tolist()))
        return ro

    def __getattr__(self, name):
        return getattr(self.engine, name)


def flaky(base_url, api_key, row):
    """The demo's agent, but sample 1 raises after its first call and sample 2 hangs."""
    from rlrig.trainer.agent.openai_demo import solve

    how = row["extra_info"]["index"] % 4
    if how in (1, 2):
        openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(
            model="m", messages=row["messages"], tools=[CALCULATOR]
        )
        if how == 2:
            import time

            time.sleep(30)
        raise RuntimeError("the agent's own bug")
    return solve(base_url, api_key, row)


@pytest.mark.process
def test_the_demo_agent_through_the_hf_engine_trains_on_what_the_engine_generated(tmp_path):
    """The embedded tool model on the hf engine: every sample's response is the engine's tokens (mask 1) and the
    tool's (mask 0) in the order they came; a raising and a hanging agent end their samples only."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.embedded.tool_model import ensure_tool_model
    from rlrig.trainer.rollout import engines
    from rlrig.trainer.rollout.engines import hf_engine

    path = ensure_tool_model()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    cfg = config(loops_file(tmp_path, f"{HERE}:flaky", timeout_s=3), "actor_rollout_ref.rollout.temperature=1.0")
    engine = Recording(
        hf_engine.HFRollout(engines.EngineContext(model, tok, cfg.actor_rollout_ref.rollout, 16, 48, path, "cpu", 0))
    )
    rows = [row(10 + i, 20 + i) for i in range(4)]
    for i, r in enumerate(rows):
        r["extra_info"]["index"] = i
    ro, turns = AgentRollout(engine, tok, cfg).generate(rows, 2)
    outcomes = [i["agent_outcome"] for i in turns.extra_info()]
    assert outcomes == ["returned"] * 2 + ["failed"] * 2 + ["timed_out"] * 2 + ["returned"] * 2
    m = turns.metrics()
    assert (m["agent/openai/failed"], m["agent/openai/timed_out"], m["agent/openai/over_budget"]) == (2, 2, 0)
    for i in range(8):
        prompt, response, mask = sample(ro, i)
        # walk the response: each run of the model's tokens is one engine call's tokens after the context before it
        k = 0
        while k < len(response):
            if mask[k]:
                context = prompt + response[:k]
                # (a row's two samples share their first context: either's tokens may be this one's)
                wrote = [w for p, w in engine.written if p == context and response[k : k + len(w)] == w]
                assert wrote, f"sample {i}: tokens at {k} were not generated after the context before them"
                assert all(mask[k : k + len(wrote[0])])
                k += len(wrote[0])
            else:
                k += 1
        assert sum(mask) > 0
