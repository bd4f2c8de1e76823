"""A rollout worker's engine calls all run on the one thread its engine was built on, whichever thread Ray calls them
from (partial rollouts run them on concurrency-group threads): OpenMP's thread count is per thread, and vLLM's CPU
attention refuses a count other than the one it set up."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from rlrig.trainer.workers.rollout_worker import on_engine_thread


class Worker:
    def __init__(self):
        self.lane = ThreadPoolExecutor(max_workers=1)
        self.built_on = self.lane.submit(threading.get_ident).result()

    @on_engine_thread
    @torch.no_grad()
    def call(self, x, scale=1.0):
        return threading.get_ident(), torch.is_grad_enabled(), x * scale


def test_calls_from_any_thread_run_on_the_engine_thread_with_their_decorators():
    w = Worker()
    with ThreadPoolExecutor(max_workers=3) as callers:
        got = list(callers.map(lambda i: w.call(i, scale=2.0), range(6)))
    assert {ident for ident, _, _ in got} == {w.built_on} != {threading.get_ident()}
    assert [grad for _, grad, _ in got] == [False] * 6  # no_grad applied on the thread that runs the call
    assert [x for _, _, x in got] == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


def test_an_error_in_the_call_reaches_the_caller():
    class Failing(Worker):
        @on_engine_thread
        def call(self):
            raise ValueError("engine said no")

    with pytest.raises(ValueError, match="engine said no"):
        Failing().call()
