"""fsdp_config.fsdp_size (verl's create_device_mesh): below the world, FSDP2 shards within groups of that many ranks
and replicates across them; -1 or the world shards over every rank. Two ranks in a real Gloo group."""

import os

import pytest
import torch

from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process


def _rank(rank, world, out_dir, fsdp_size):
    from rlrig.trainer.model.parallel import fsdp_shard

    torch.manual_seed(0)
    module = fsdp_shard(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)), fsdp_size=fsdp_size)
    w = module[0].weight
    torch.save(
        {"mesh": tuple(w.device_mesh.shape), "local_rows": w.to_local().shape[0], "placements": str(w.placements)},
        os.path.join(out_dir, f"{rank}.pt"),
    )


@pytest.mark.parametrize(
    "fsdp_size, mesh, local_rows, placement",
    [
        (1, (2, 1), 6, "Replicate"),  # groups of one: each rank holds the whole weight, replicated
        (-1, (2,), 3, "Shard"),  # every rank: half the rows each
        (2, (2,), 3, "Shard"),  # the world itself
    ],
)
def test_fsdp_size_sets_the_shard_group(tmp_path, fsdp_size, mesh, local_rows, placement):
    gloo_ranks.run(2, _rank, str(tmp_path), fsdp_size)
    for r in range(2):
        got = torch.load(tmp_path / f"{r}.pt")
        assert got["mesh"] == mesh and got["local_rows"] == local_rows and placement in got["placements"]


@pytest.mark.parametrize(
    "extra, refusal",
    [
        (["actor_rollout_ref.actor.fsdp_config.fsdp_size=2"], None),
        (["actor_rollout_ref.actor.fsdp_config.fsdp_size=8"], None),  # at least the workers: all of them
        (["actor_rollout_ref.actor.fsdp_config.fsdp_size=3"], "does not divide the 4 workers"),
        (["actor_rollout_ref.actor.fsdp_config.fsdp_size=0"], "must be -1 or at least 1"),
        (["actor_rollout_ref.actor.strategy=ddp", "critic.model.fsdp_config.fsdp_size=2"], "DDP keeps whole replicas"),
        (
            [
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.ref.enable_resource_pool=True",
                "actor_rollout_ref.ref.nnodes=1",
                "actor_rollout_ref.ref.n_gpus_per_node=1",
                "actor_rollout_ref.ref.fsdp_config.fsdp_size=2",
            ],
            "the reference's own pool holds whole copies",
        ),
    ],
)
def test_fsdp_size_config(extra, refusal):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    base = ["trainer.n_gpus_per_node=4"]
    if refusal is None:
        parse_overrides([*base, *extra])
        return
    with pytest.raises(ConfigError, match=refusal):
        parse_overrides([*base, *extra])


class _Blocks(torch.nn.Sequential):
    _no_split_modules = ["Linear"]  # each Linear a unit of its own, as a model's decoder blocks


def _reshard_rank(rank, world, out_dir, fsdp_size, reshard):
    from torch.distributed.tensor import DTensor

    from rlrig.trainer.model.parallel import fsdp_shard

    torch.manual_seed(0)
    module = fsdp_shard(_Blocks(torch.nn.Linear(4, 6), torch.nn.Linear(6, 2)), None, fsdp_size, reshard)
    module(torch.ones(3, 4)).sum()  # a forward with the graph kept: the backward has not run
    torch.save({"sharded": isinstance(module[0].weight, DTensor)}, os.path.join(out_dir, f"{rank}.pt"))


@pytest.mark.parametrize(
    "fsdp_size, reshard, sharded",
    [
        (-1, True, True),  # verl's default: a unit frees its gathered weights after its forward
        (-1, False, False),  # kept gathered until the backward
        (1, True, False),  # a shard group of one rank: nothing to free, so nothing resharded
    ],
)
def test_reshard_after_forward_where_the_shard_group_has_ranks_to_share_with(tmp_path, fsdp_size, reshard, sharded):
    gloo_ranks.run(2, _reshard_rank, str(tmp_path), fsdp_size, reshard)
    assert [torch.load(tmp_path / f"{r}.pt")["sharded"] for r in range(2)] == [sharded] * 2
