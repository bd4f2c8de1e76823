"""Which generations let the rollout engine drop its weights between rollouts (vLLM's sleep level 2, SGLang's
released weights): only a step's last one before its weight sync, never one another generation follows first."""

import pytest

from rlrig.trainer.driver.single_process import single_worker
from rlrig.trainer.workers.step.request import StepRequest

pytestmark = pytest.mark.process

# FSDP: the hf engine generates with a copy of the actor that each sync refreshes, as vLLM and SGLang hold one
BASE = [
    "data.train_batch_size=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.rollout.name=hf",
    "actor_rollout_ref.actor.strategy=fsdp",
]


class Recorder:
    """The worker's engine with its rollouts recorded (the agent loop's engine calls hold the engine's memory until it
    rests, which is where an engine frees it). A generation straight after a rest that let the weights go fails, as it
    would sample from garbage in an engine that dropped them."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
        assert self.calls[-1:] != ["gen, sync follows"], "a generation from dropped weights"
        assert hold, "every engine call of a rollout holds the engine until the rollout rests"
        return self.engine.generate(prompts, n, sampling, max_new=max_new, hold=hold)

    def rest(self, sync_follows=False):
        self.calls.append("gen, sync follows" if sync_follows else "gen")
        self.engine.rest(sync_follows)

    def agree(self, more):
        return self.engine.agree(more)

    def sync_weights(self, weights):
        self.calls.append("sync")
        self.engine.sync_weights(weights)

    def close(self):
        self.engine.close()


@pytest.mark.parametrize(
    "extra,script,calls",
    [
        # validation between steps keeps the weights: the next step's rollout reuses them
        ([], ["step", "val", "step"], ["gen, sync follows", "sync", "gen", "gen, sync follows", "sync"]),
        # ReMax: the greedy baseline is generated after the samples, from the same weights
        (["algorithm.adv_estimator=remax"], ["step"], ["gen", "gen, sync follows", "sync"]),
        # the critic's warm-up step (step 1 < critic_warmup) leaves the actor (and the engine) as they were
        (
            ["algorithm.adv_estimator=gae", "trainer.critic_warmup=2"],
            ["step", "step"],
            ["gen", "gen, sync follows", "sync"],
        ),
    ],
    ids=["grpo-with-validation", "remax", "critic-warmup"],
)
def test_the_engine_drops_its_weights_only_where_a_sync_follows(extra, script, calls):
    with single_worker([*BASE, *extra]) as (w, batches):
        w.engine = w.agent.engine = Recorder(w.engine)
        for i, action in enumerate(script):
            rows = next(batches)
            w.step(StepRequest(rows, global_step=i + 1, kl_coef=0.0)) if action == "step" else w.evaluate(rows)
        assert w.engine.calls == calls
