"""Expert parallelism over 2 Gloo ranks equals one process: each rank holds half of every layer's experts and its
own half of the global batch; the mean of the ranks' losses is the single process's loss on the whole batch, each
rank's expert gradients are the single process's for its experts, and the other gradients, averaged over the ranks
as data parallelism averages them, are the single process's."""

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = pytest.mark.process

_TOL = dict(rtol=1e-4, atol=1e-6)


def _rank(rank, world, port, family):
    from rlrig.trainer.model.expert_parallel import ExpertParallelExperts, gather_experts, parallelize
    from tests.helpers.tiny_moe import build

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model, tok = build(family, seed=0)
    ep_model = copy.deepcopy(model)
    torch.manual_seed(1)
    ids = torch.randint(3, len(tok), (4, 12))  # the global batch, the same on every rank

    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()

    names = parallelize(ep_model, dist.group.WORLD, grad_divisor=world)
    assert len(names) == 2  # one experts module per layer
    half = ids.chunk(world)[rank]
    ep_loss = ep_model(input_ids=half, labels=half).loss
    ep_loss.backward()

    mean_loss = ep_loss.detach().clone()
    dist.all_reduce(mean_loss)
    torch.testing.assert_close(mean_loss / world, loss.detach(), **_TOL)

    full = dict(model.named_parameters())
    for name, p in ep_model.named_parameters():
        ref = full[name].grad
        owner = ep_model.get_submodule(name.rpartition(".")[0])
        if isinstance(owner, ExpertParallelExperts):
            own = slice(owner.first, owner.first + owner.local)
            assert p.shape[0] == ref.shape[0] // world
            torch.testing.assert_close(p.grad, ref[own], **_TOL)
            torch.testing.assert_close(p.detach(), full[name].detach()[own])
        else:
            g = p.grad.clone()
            dist.all_reduce(g)
            torch.testing.assert_close(g / world, ref, **_TOL)

    layer = ep_model.get_submodule(names[0])
    whole = model.get_submodule(names[0])
    gathered = gather_experts(layer)
    assert torch.equal(gathered["gate_up_proj"], whole.gate_up_proj.detach())
    assert torch.equal(gathered["down_proj"], whole.down_proj.detach())
    dist.destroy_process_group()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_two_expert_parallel_ranks_equal_one_process(family):
    from rlrig.entrypoint.cluster.ports import kernel_free_port

    mp.spawn(_rank, args=(2, kernel_free_port(), family), nprocs=2)


def test_a_model_without_fused_experts_is_refused():
    from rlrig.trainer.model.expert_parallel import parallelize

    with pytest.raises(ValueError, match="has no fused experts module"):
        parallelize(torch.nn.Linear(2, 2), group=None)


@pytest.mark.parametrize(
    "key", ["actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.ref.fsdp_config", "critic.model.fsdp_config"]
)
def test_expert_parallel_size_is_refused_until_the_workers_use_it(key):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    parse_overrides([f"{key}.expert_parallel_size=1"])
    with pytest.raises(ConfigError, match=f"{key}.expert_parallel_size=2: expert parallelism in training is not yet"):
        parse_overrides([f"{key}.expert_parallel_size=2"])
