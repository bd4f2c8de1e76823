"""What a worker tells the head's watchdog: each phase as it starts and idle when its call returns, put into the
store by a thread of its own (the latest note, never one twice), an injected hang firing in its phase once, and
nothing at all (no Ray started) in a worker that runs without Ray."""

import json
import time

import pytest

from rlrig.trainer.workers import phase_report
from rlrig.trainer.workers.timing import PHASES, Phases


class MemoryKv:
    def __init__(self):
        self.puts = []

    def _internal_kv_put(self, key, value, overwrite, namespace):
        assert overwrite and namespace == phase_report.NAMESPACE
        self.puts.append((key, json.loads(value)))


class Hung(Exception):
    pass


@pytest.fixture
def report(monkeypatch):
    def hang():
        r.hung_in = r.entry  # what the publishing thread would put while the worker hangs
        raise Hung

    monkeypatch.setattr(phase_report, "hang_forever", hang)
    r = phase_report.PhaseReport("rank 1")
    r.kv, r.key = MemoryKv(), b"job/rank 1"
    return r


def test_phases_are_told_as_they_start_and_idle_at_the_end(report):
    phases = Phases(enter=lambda name: report.enter(name, 7))
    with phases("gen"):
        pass
    report.publish()
    with phases("update_actor"):
        pass
    report.publish()
    report.leave()
    report.publish()
    report.publish()  # nothing new: no put
    # "entered" counts the phases begun, so the watchdog tells a call from the next in the same phase and step
    assert [e for _, e in report.kv.puts] == [
        {"phase": "gen", "step": 7, "entered": 1},
        {"phase": "update_actor", "step": 7, "entered": 2},
        {"phase": "", "step": 0, "entered": 2},
    ]


@pytest.mark.parametrize(
    "fault, fires_in",
    [("gen", "gen"), ("reward", "reward"), ("collective", "update_actor"), ("update_actor", "update_actor")],
)
def test_an_armed_fault_hangs_in_its_phase_once(report, fault, fires_in):
    report.fault = fault
    fired = []
    for phase in ("gen", "reward", "old_log_prob", "update_actor", "gen", "reward", "update_actor"):
        try:
            report.enter(phase, 3)
        except Hung:
            fired.append(phase)
    assert fired == [fires_in]
    assert report.hung_in[0] == fires_in  # noted before the worker hangs in it, so the thread puts it


def test_the_thread_puts_the_latest_note_without_the_step_waiting(report):
    report.start_publishing(interval=0.01)
    for phase in ("gen", "reward", "ref", "update_actor"):
        report.enter(phase, 5)
    report.leave()
    deadline = time.monotonic() + 10
    while report.published != ("", 0, 4) and time.monotonic() < deadline:
        time.sleep(0.01)
    puts = [e for _, e in report.kv.puts]
    assert puts[-1] == {"phase": "", "step": 0, "entered": 4}
    assert len(puts) <= 5 and len({json.dumps(e) for e in puts}) == len(puts)  # later notes replace earlier ones


def test_a_failed_put_is_raised_in_the_next_phase(report):
    def refused(*_, **__):
        raise ConnectionError("the store is gone")

    report.kv._internal_kv_put = refused
    report.start_publishing(interval=0.01)
    report.enter("gen", 1)
    deadline = time.monotonic() + 10
    while report.failed is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(ConnectionError, match="the store is gone"):
        report.enter("reward", 1)


def test_without_ray_nothing_is_reported_and_no_ray_is_started():
    import ray

    r = phase_report.PhaseReport("rank 0")
    r.enter("gen", 1)
    r.leave()
    assert r.kv is None and not ray.is_initialized()


def test_every_phase_a_step_times_is_known_to_the_watchdog():
    """A phase missing from PHASES could not be injected (RLRIG_FAULT_HANG refuses its name)."""
    import re
    from pathlib import Path

    import rlrig.trainer as trainer

    used = set()
    for path in Path(trainer.__file__).parent.rglob("*.py"):
        used |= set(re.findall(r'phases\("(\w+)"', path.read_text()))
    assert used and used <= set(PHASES), used - set(PHASES)
