"""actor_rollout_ref.nccl_timeout bounds every collective of a worker's process groups, the groups made after the
default one included (sequence parallel, engines' tensor-parallel groups): with Gloo in two processes, a collective
one rank never enters raises on the other after the timeout instead of blocking."""

import multiprocessing as mp
import time
from datetime import timedelta

import pytest

from rlrig.entrypoint.cluster.ports import kernel_free_port
from rlrig.trainer.workers.base import collective_timeout

pytestmark = pytest.mark.process

TIMEOUT_S = 3


def rank_main(rank: int, port: int, out):
    import torch
    import torch.distributed as dist

    timeout = collective_timeout(TIMEOUT_S)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout)
    later = dist.new_group([0, 1])  # made after init, as ulysses' and the engines' groups are
    if rank == 1:
        time.sleep(TIMEOUT_S * 3)  # never enters the collective
        out.put((rank, "skipped", 0.0))
        return
    for group in (later, None):
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=group)
            out.put((rank, "returned", time.monotonic() - t0))
        except RuntimeError:
            out.put((rank, "raised", time.monotonic() - t0))


def test_a_collective_a_peer_never_joins_raises_after_nccl_timeout():
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), kernel_free_port()
    procs = [ctx.Process(target=rank_main, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    got = [out.get(timeout=TIMEOUT_S * 10) for _ in range(3)]
    for p in procs:
        p.join(TIMEOUT_S * 10)
        if p.is_alive():
            p.kill()
    waited = [(what, s) for rank, what, s in got if rank == 0]
    assert [w for w, _ in waited] == ["raised", "raised"], got  # the later group and the default one
    assert all(TIMEOUT_S - 0.5 < s < TIMEOUT_S * 3 for _, s in waited), got


def test_groups_made_later_get_the_timeout_too():
    from torch.distributed import distributed_c10d as c10d

    before = (c10d.default_pg_timeout, c10d.default_pg_nccl_timeout)
    try:
        assert collective_timeout(42) == timedelta(seconds=42)
        assert c10d._get_default_timeout("gloo") == timedelta(seconds=42)
        if isinstance(before[1], timedelta):
            assert c10d._get_default_timeout(c10d.Backend.NCCL) == timedelta(seconds=42)
    finally:
        c10d.default_pg_timeout, c10d.default_pg_nccl_timeout = before


@pytest.mark.parametrize("value", ["0", "-5"])
def test_a_bad_nccl_timeout_is_refused(value):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    with pytest.raises(ConfigError, match=f"actor_rollout_ref.nccl_timeout={value} must be positive"):
        parse_overrides([f"actor_rollout_ref.nccl_timeout={value}"])
