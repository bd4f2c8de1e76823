"""A worker that holds the rollout engine asks first whether it can run where it is (workers/start_checks.py) and,
refused, builds nothing and says why; the driver reads every worker's answer as it comes and ends the run at the
first refusal, in one line, without waiting on the workers still starting."""

import time

import pytest

from rlrig.trainer.driver.launch import first_refusal
from tests.integration.test_train import rlrig

pytestmark = pytest.mark.process


def test_an_engine_that_cannot_run_here_ends_the_run_in_one_line(tmp_path):
    r = rlrig(
        "train",
        "actor_rollout_ref.rollout.name=sglang",  # a GPU engine, on CPU
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        timeout=300,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith("rlrig: error: actor_rollout_ref.rollout.name=sglang: sglang runs on cuda, not cpu;")
    assert not list((tmp_path / "run").rglob("*"))  # nothing trained, nothing written


class Answers:
    """A worker's refusal call: `why` after `after` seconds of its constructor (a long one: a rank that waits in a
    collective for one that was refused)."""

    def __init__(self, why, after):
        time.sleep(after)
        self.why = why

    def refusal(self):
        return self.why


@pytest.fixture
def ray_here():
    import ray

    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


# each worker's (refusal, seconds its constructor takes), and the answer; one Ray for the table
ANSWERS = [
    ([(None, 0), (None, 1)], None),
    ([(None, 600), ("rank 1: refused", 0), (None, 0)], "rank 1: refused"),  # not waiting on the first
]


def test_the_driver_answers_at_the_first_refusal(ray_here):
    for answers, first in ANSWERS:
        workers = [ray_here.remote(Answers).remote(why, after) for why, after in answers]
        started = time.monotonic()
        assert first_refusal(workers) == first
        assert time.monotonic() - started < 120
        for w in workers:
            ray_here.kill(w)
