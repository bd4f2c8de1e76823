"""A test's check on each rank of a real Gloo group: `run(world, check, *args)` runs check(rank, world, *args) on
ranks 0..world-1, each a process of its own, and raises the first rank's error with its traceback.

The rank processes are started once (spawn) and kept for the next check, each in a fresh group: starting a process
that imports torch and the model stack costs seconds of CPU, more than most checks. A check that fails, or a rank
that dies, ends every rank process (the others may be waiting on it in a collective); the next check starts new ones.

What a check builds (a sharded or DDP-wrapped model, a device mesh, sequence-parallel groups) holds process groups.
Freed after the groups were destroyed, a group's destructor can abort the process ("terminate called without an
active exception", SIGABRT, about one run in ten on two cores). So the check returns, what it built is collected
and the meshes forgotten, and only then is the group destroyed, as RankWorker.shutdown does."""

from __future__ import annotations

import atexit
import gc
import os
import traceback
from datetime import timedelta
from multiprocessing.connection import wait

import torch.distributed as dist
import torch.multiprocessing as mp

# a collective that one rank never joins fails after this, not after Gloo's default half hour
TIMEOUT = timedelta(seconds=300)


def in_group(rank: int, world: int, port: int, check, *args) -> None:
    from rlrig.trainer.model import parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=TIMEOUT)
    check(rank, world, *args)
    gc.collect()
    parallel.forget_meshes()
    dist.destroy_process_group()


def _serve(rank: int, conn) -> None:
    """A rank process: runs the checks it is sent until told to stop (None, or its test process gone) or one fails.
    Not a daemon, so that a check may start processes of its own."""
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        world, port, check, args = job
        try:
            in_group(rank, world, port, check, *args)
        except BaseException:  # noqa: BLE001 (sent to the test, which raises it)
            conn.send(traceback.format_exc())
            return  # its group may be half torn down: a fresh process serves the next check
        conn.send(None)


class _Ranks:
    def __init__(self):
        self.procs: list = []
        self.conns: list = []

    def run(self, world: int, check, *args) -> None:
        from rlrig.entrypoint.cluster.ports import kernel_free_port

        ctx = mp.get_context("spawn")
        while len(self.procs) < world:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(len(self.procs), child))
            proc.start()
            child.close()  # the rank's end is its own: its death then reads as EOF here
            self.procs.append(proc)
            self.conns.append(parent)
        port = kernel_free_port()
        conns = self.conns[:world]
        for conn in conns:
            conn.send((world, port, check, args))
        pending = list(conns)
        while pending:
            ready = wait(pending, timeout=TIMEOUT.total_seconds() + 60)
            if not ready:
                self.close()
                raise AssertionError(f"{check.__name__}: no rank finished within {TIMEOUT}")
            for conn in ready:
                pending.remove(conn)
                rank = conns.index(conn)
                try:
                    error = conn.recv()
                except EOFError:
                    self.procs[rank].join(5)
                    error = f"rank {rank} died (exit code {self.procs[rank].exitcode})"
                if error is not None:
                    self.close()
                    raise AssertionError(f"{check.__name__} failed on rank {rank}:\n{error}")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc in self.procs:
            proc.join(2)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.procs, self.conns = [], []


_RANKS = _Ranks()
atexit.register(_RANKS.close)


def run(world: int, check, *args) -> None:
    """check(rank, world, *args) on each of `world` ranks of a fresh Gloo group; the first rank's error raised."""
    _RANKS.run(world, check, *args)
