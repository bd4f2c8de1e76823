"""A test's check on each rank of a real Gloo group, spawned by torch.multiprocessing:
`mp.spawn(in_group, args=(world, port, check, *args), nprocs=world)` runs check(rank, world, *args) on every rank.

What a check builds (a sharded or DDP-wrapped model, a device mesh, sequence-parallel groups) holds process groups.
Freed after the groups were destroyed, a group's destructor at the process's exit can abort it ("terminate called
without an active exception", SIGABRT, about one run in ten on two cores). So the check returns, what it built is
collected and the meshes forgotten, and only then is the group destroyed, as RankWorker.shutdown does."""

import gc
import os

import torch.distributed as dist


def in_group(rank: int, world: int, port: int, check, *args) -> None:
    from rlrig.trainer.model import parallel

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    check(rank, world, *args)
    gc.collect()
    parallel.forget_meshes()
    dist.destroy_process_group()
