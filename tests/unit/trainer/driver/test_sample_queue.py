"""The fully async mode's freshness control and sample queue, against verl's rules worked by hand, and the run's size
from its keys."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver.fully_async import total_prompts, total_versions
from rlrig.trainer.driver.sample_queue import Freshness, Group, SampleQueue, stale_bound


@pytest.mark.parametrize(
    "required, staleness, trigger, max_required",
    [
        (16, 0.0, 1, 16),  # on-policy: exactly what one version trains
        (16, 0.5, 2, 48),  # 16 x 1.5 x 2
        (32, 0.1, 4, 140),  # verl's defaults with a mini batch of 32: int(140.8)
        (8, 1.0, 1, 16),  # about one step off-policy
    ],
)
def test_freshness_bounds_the_prompts_started_per_version(required, staleness, trigger, max_required):
    f = Freshness(required, staleness, trigger)
    assert f.max_required == max_required
    assert f.room(queued=0) == max_required
    f.start(max_required - 3)
    assert f.room(queued=0) == 3
    f.start(3)
    assert f.room(queued=0) == 0
    assert f.room(queued=max_required) == 0  # a full queue stops starts whatever the count


def test_a_new_version_counts_what_is_still_in_flight_or_queued():
    f = Freshness(16, 0.5, 1)  # 24 a version
    f.start(24)
    f.new_version(in_flight=5, queued=3)
    assert f.room(queued=3) == 16  # the excess of the last version is paid for in this one
    assert f.room(queued=24) == 0


@pytest.mark.parametrize("staleness, bound", [(0.0, 0), (0.1, 1), (0.5, 1), (1.0, 1), (1.5, 2)])
def test_stale_bound_is_the_versions_the_excess_may_span(staleness, bound):
    assert stale_bound(staleness) == bound


def test_the_queue_takes_the_oldest_and_drops_what_is_staler_than_its_bound():
    q = SampleQueue(bound=1)
    q.put([Group(i, None, v) for i, v in [(0, 0), (1, 1), (2, 2), (3, 2)]])
    assert q.take(5) is None and len(q) == 4
    gone = q.drop_stale(version=2)  # version 0 is two behind
    assert [g.index for g in gone] == [0] and q.dropped == 1
    assert [g.index for g in q.take(2)] == [1, 2]
    assert q.indices() == [3]


BASE = [
    "actor_rollout_ref.hybrid_engine=False",
    "data.train_batch_size=0",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "async_training.require_batches=2",
    "async_training.trigger_parameter_sync_step=3",
]


@pytest.mark.parametrize(
    "extra, prompts, updates, versions",
    [
        (["rollout.total_rollout_steps=100"], 1000, 6, 2),  # 100 // 16 = 6 updates, 3 a version
        (["rollout.total_rollout_steps=120"], 1000, 7, 3),  # the last version has one update
        (["rollout.total_rollout_steps=null", "trainer.total_epochs=2"], 40, 5, 2),  # the data set twice: 80
        (["rollout.total_rollout_steps=null", "rollout.total_epochs=1"], 40, 2, 1),
        (["rollout.total_rollout_steps=1000", "trainer.total_training_steps=2"], 1000, 6, 2),  # capped versions
    ],
)
def test_a_fully_async_run_is_sized_by_its_prompts(extra, prompts, updates, versions):
    cfg = parse_overrides([*BASE, *extra])
    assert cfg.data.train_batch_size == 16  # require_batches x ppo_mini_batch_size
    assert total_versions(cfg, prompts) == (updates, versions)
    assert total_prompts(cfg, prompts) <= prompts * cfg.trainer.total_epochs
