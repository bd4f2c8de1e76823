"""Loops of your own across weight syncs (agent/own_partial.py): a sync halts a loop's generate call mid-turn, the
prompt crosses to the driver and back (pickled, as Ray carries it) while its loops wait on the worker, and the call
goes on under the new weights; the loop sees one answer per call, the same tokens an uninterrupted run gives, each
with the log-prob of the weights that drew it. And the runs rlrig does not build that way are refused at start-up."""

import pickle

import pytest

from rlrig.trainer.agent import own_loops
from rlrig.trainer.agent.own_partial import LoopPartial, OwnPartials
from rlrig.trainer.agent.rollout import AgentRollout
from rlrig.trainer.agent.verl_api import AgentLoopBase, AgentLoopOutput
from rlrig.trainer.errors import ConfigError
from tests.unit.trainer.agent.test_own_loops import EOS, TOK, config, ids, loops_file, row
from tests.unit.trainer.agent.test_partial import Interruptible, halted_after

ENTRIES = f"""\
- name: retry
  _target_: {__name__}.TwoCalls
"""
SCRIPT = {"12*3=": f"#### 36{EOS}", "4*5=": f"#### 20{EOS}"}


class TwoCalls(AgentLoopBase):
    """Answers, is asked another sum (masked out), answers again: two generate calls, their log-probs kept."""

    async def run(self, sampling_params, **kwargs):
        prompt = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        first = await self.server_manager.generate(request_id="a", prompt_ids=prompt, sampling_params=sampling_params)
        asked = ids("4*5=")
        second = await self.server_manager.generate(
            request_id="b", prompt_ids=prompt + first.token_ids + asked, sampling_params=sampling_params
        )
        return AgentLoopOutput(
            prompt_ids=prompt,
            response_ids=first.token_ids + asked + second.token_ids,
            response_mask=[1] * len(first.token_ids) + [0] * len(asked) + [1] * len(second.token_ids),
            response_logprobs=first.log_probs + [0.0] * len(asked) + second.log_probs,
            num_turns=4,
            metrics={},
        )


class Scripted(Interruptible):
    """test_partial's scripted engine, taking the loops' sampling as the engines do."""

    def generate_until(self, prompts, max_new, stopped, sampling=None):
        return super().generate_until(prompts, max_new, stopped)

    def rest(self, sync_follows=False):
        pass


def run(tmp_path, halts: list[int | None]):
    """Two samples of one prompt by the retry loop, call k halted after halts[k] engine steps, the weights a version
    newer each call: the calls made, the Rollout and its trajectories."""
    cfg = config(loops_file(tmp_path, ENTRIES), "retry")
    engine = Scripted(SCRIPT)
    agent = AgentRollout(engine, TOK, cfg)
    partials = OwnPartials(agent, agent.own, cfg, logprobs=None)
    items, calls = [LoopPartial(0, row("12*3=", "retry"), 2, home=0)], 0
    try:
        while not items[0].finished:
            stopped = halted_after(engine, halts[calls] if calls < len(halts) else None)
            partials.go_on(items, stopped, engine.version)
            items = pickle.loads(pickle.dumps(items))
            calls += 1
            engine.version += 1
        ro, turns = partials.packed(items)
        return calls, items[0].versions, ro, turns
    finally:
        partials.close()


def test_a_halted_loop_goes_on_under_the_new_weights_as_one_call(tmp_path):
    whole_calls, whole_versions, whole, whole_turns = run(tmp_path, [])
    calls, versions, ro, turns = run(tmp_path, [2, 3])
    assert (whole_calls, whole_versions) == (1, [0])
    assert calls == 3 and versions == [0, 1, 2]
    # the same samples as one uninterrupted run: the loop saw each of its two turns answered once, whole
    assert ro.input_ids.tolist() == whole.input_ids.tolist()
    assert ro.response_mask.tolist() == whole.response_mask.tolist()
    assert [t.info() for t in turns.trajs] == [t.info() for t in whole_turns.trajs]
    # each generated token's log-prob is that of the weights that drew it: 2 steps on version 0, 3 on 1, the rest
    # (of the first call, and the second call) on 2
    for i in range(2):
        drawn = [lp for lp, m in zip(ro.engine_logp[i].tolist(), ro.response_mask[i].tolist()) if m]
        assert drawn[:5] == [-1.0, -1.0, -2.0, -2.0, -2.0] and set(drawn[5:]) == {-3.0}, drawn


@pytest.mark.parametrize(
    "extra, names, message",
    [
        (
            [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                "trainer.n_gpus_per_node=2",
            ],
            {"retry"},
            "agent loop retry with actor_rollout_ref.rollout.tensor_model_parallel_size=2: a loop of your own halted",
        ),
        ([], {"retry", "tool_agent"}, "agent loop retry beside rows of rlrig's tool_agent"),
    ],
)
def test_what_partial_rollouts_do_not_build_with_loops_of_your_own_is_refused(tmp_path, extra, names, message):
    cfg = config(loops_file(tmp_path, ENTRIES), "retry", *extra)
    cfg.trainer.async_mode = "fully_async_policy"  # its pool's keys aside: the check reads these
    with pytest.raises(ConfigError, match=message):
        own_loops.check(cfg, names)
    cfg.async_training.partial_rollout = False
    own_loops.check(cfg, names)


def test_loops_of_your_own_alone_run_with_partial_rollouts(tmp_path):
    cfg = config(loops_file(tmp_path, ENTRIES), "retry")
    cfg.trainer.async_mode = "fully_async_policy"
    own_loops.check(cfg, {"retry"})
