"""Multi-turn partial rollouts (agent/partial.py): a weight sync halts trajectories mid-turn, they cross to the driver
and back (pickled, as Ray carries them) and go on under the new weights. What they end as is what one uninterrupted
run gives, token for token and mask for mask; each token's log-prob is that of the weights that drew it; a turn's tool
call runs once, after the turn ends, whichever call ends it; an interaction's state goes with the trajectory."""

import pickle

import pytest

from rlrig.trainer.agent import partial
from rlrig.trainer.agent.partial import AgentPartial
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.rollout.engines.base import pack_responses
from tests.unit.trainer.agent.test_loop import EOS, TOK, Cfg, Teacher, calc_config, call, decode_parts, ids, row

__all__ = ["calc_config"]  # the fixture, used by name


class Interruptible:
    """The engine interface of partial rollouts over a script (a context's text -> the turn's text): a context that
    ends with part of a scripted turn gets the rest of it. Every token's log-prob is -(1 + version), so a test reads
    which weights drew it; stopped() is asked after each token, as a real engine asks between steps."""

    def __init__(self, script: dict[str, str]):
        self.script = {k: ids(v) for k, v in script.items()}
        self.version = 0
        self.steps = 0  # engine steps (a token of every row) so far

    def rest_of_turn(self, context: list[int]) -> list[int]:
        text = TOK.decode(context, skip_special_tokens=False)
        found = [
            (len(key) + j, turn[j:])
            for key, turn in self.script.items()
            for j in range(len(turn))
            if text.endswith(key + TOK.decode(turn[:j], skip_special_tokens=False))
        ]
        return max(found, key=lambda f: f[0])[1]

    def generate_until(self, prompts, max_new, stopped):
        rests = [self.rest_of_turn(p)[:max_new] for p in prompts]
        out = [[] for _ in prompts]
        while any(len(o) < len(r) for o, r in zip(out, rests)):
            for o, r in zip(out, rests):
                if len(o) < len(r):
                    o.append(r[len(o)])
            self.steps += 1
            if stopped():
                break
        logps = [[-(1.0 + self.version)] * len(o) for o in out]
        ended = [bool(o) and o[-1] == TOK.eos_token_id for o in out]
        return pack_responses(prompts, 1, out, logps, max_new, TOK.pad_token_id, TOK.eos_token_id), ended

    def agree(self, more):
        return more


SCRIPT = {"12*3=": call("12*3"), "</tool_response>": f"#### 36{EOS}"}


def halted_after(engine: Interruptible, steps: int | None):
    """A stopped() that holds once the engine has taken `steps` more steps (None: never)."""
    start = engine.steps
    return lambda: steps is not None and engine.steps - start >= steps


def run_halted(agent: AgentRollout, engine: Interruptible, items: list[AgentPartial], halts: list[int]):
    """Calls until every item ends: call k halted after halts[k] engine steps (the rest run through), the weights one
    version newer each call, the items pickled between calls. (the number of calls, the items)"""
    calls = 0
    while not all(it.finished for it in items):
        stopped = halted_after(engine, halts[calls] if calls < len(halts) else None)
        partial.go_on(agent, items, stopped, None, engine.version)
        items = pickle.loads(pickle.dumps(items))
        calls += 1
        engine.version += 1
    return calls, items


@pytest.mark.parametrize(
    "halts, versions",
    [
        ([3], [0, 1]),  # mid-way through the call turn: the rest of it, the tool, the answer under version 1
        ([3, 2], [0, 1, 2]),  # and again, mid-way through it
        ([len(ids(call("12*3"))) + 2], [0, 1]),  # in the answer turn, after the tool round (no step of its own)
    ],
)
def test_a_halted_turn_goes_on_under_the_new_weights_to_what_one_run_gives(calc_config, halts, versions):
    engine = Interruptible(SCRIPT)
    agent = AgentRollout(engine, TOK, Cfg(calc_config))
    calls, items = run_halted(agent, engine, [AgentPartial(0, row("12*3="), 2)], halts)
    assert calls == len(versions) and items[0].versions == versions
    ro, stats = partial.packed(agent, items)
    whole_turn = len(ids(call("12*3")))
    for i, t in enumerate(stats.trajs):
        whole, own = decode_parts(ro, i)
        assert whole == call("12*3") + "<tool_response>36</tool_response>" + f"#### 36{EOS}"
        assert own == call("12*3") + f"#### 36{EOS}"
        assert (t.num_turns, t.tool_calls, t.assistant_turns, t.turn) == (4, 1, 2, [])
        # each model token's log-prob names the version that drew it; the tool's tokens have none
        drawn = [v for v, m in zip(ro.engine_logp[i].tolist(), ro.response_mask[i].tolist()) if m]
        first = halts[0]
        assert drawn[:first] == [-1.0] * first and drawn[first:] != [] and set(drawn[first:]) <= {-2.0, -3.0}
        seen = ro.attention_mask[i, ro.prompt_len :].bool() & ~ro.response_mask[i].bool()
        assert seen.any() and (ro.engine_logp[i][seen] == 0).all()
        assert len(drawn) == whole_turn + len(ids(f"#### 36{EOS}"))


def test_a_call_halted_before_it_began_leaves_its_items_as_they_were(calc_config):
    engine = Interruptible(SCRIPT)
    agent = AgentRollout(engine, TOK, Cfg(calc_config))
    items = [AgentPartial(0, row("12*3="), 1)]
    partial.go_on(agent, items, lambda: True, None, 0)
    assert not items[0].finished and items[0].trajs[0].ids == [] and items[0].versions == [0]


def test_an_interactions_state_goes_with_a_halted_trajectory(calc_config):
    """The teacher remembers nothing but the request it started; halted mid-answer and resumed from a pickled copy,
    the conversation ends as one run ends it."""
    engine = Interruptible({"3+3=": f"#### 6{EOS}", "0.": f"#### 7{EOS}"})
    agent = AgentRollout(engine, TOK, Cfg(calc_config))
    agent.loop.interactions = {"teacher": Teacher({"name": "teacher"})}
    _, items = run_halted(agent, engine, [AgentPartial(0, row("3+3=", interaction_kwargs={"name": "teacher"}), 1)], [2])
    ro, stats = partial.packed(agent, items)
    t = stats.trajs[0]
    assert t.num_turns == 5 and t.turn_scores == [0.0, 1.0]
    assert decode_parts(ro, 0)[0] == f"#### 6{EOS}0.#### 7{EOS}1."


def test_an_engine_without_log_probs_is_scored_wave_by_wave(calc_config):
    """The hf engine reports none: the caller's logprobs(rollout) scores each wave's tokens while the weights that
    drew them are still the engine's."""

    class Silent(Interruptible):
        def generate_until(self, prompts, max_new, stopped):
            ro, ended = super().generate_until(prompts, max_new, stopped)
            ro.engine_logp = None
            return ro, ended

    engine = Silent(SCRIPT)
    agent = AgentRollout(engine, TOK, Cfg(calc_config))
    seen = []

    def logprobs(ro):
        seen.append(engine.version)
        return ro.response_mask * -(1.0 + engine.version)

    items = [AgentPartial(0, row("12*3="), 1)]
    partial.go_on(agent, items, halted_after(engine, 3), logprobs, 0)
    engine.version = 1
    partial.go_on(agent, items, lambda: False, logprobs, 1)
    ro, _ = partial.packed(agent, items)
    drawn = [v for v, m in zip(ro.engine_logp[0].tolist(), ro.response_mask[0].tolist()) if m]
    assert drawn[:3] == [-1.0] * 3 and set(drawn[3:]) == {-2.0} and seen == [0, 1, 1]
