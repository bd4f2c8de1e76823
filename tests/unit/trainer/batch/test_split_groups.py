"""Advantages of prompt groups cut apart between workers (a rollout pool's batch shared by sample): every registered
estimator, run by workers of a real Gloo group that each hold a scattered part of the batch, gives each worker the
rows the estimator gives over the whole batch in one process. With sequence parallelism the ranks of one group hold
the same samples, and the batch is gathered from one rank of each."""

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist

from rlrig.trainer.algos.core_algos import local
from rlrig.trainer.algos.estimators import ESTIMATORS
from rlrig.trainer.algos.estimators.registry import AdvantageInput
from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process

PROMPTS, N, R = 3, 4, 5


def _whole_batch() -> AdvantageInput:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, R + 1, (PROMPTS * N,), generator=g)
    mask = (torch.arange(R)[None] < lengths[:, None]).float()
    scores = torch.randint(0, 3, (PROMPTS * N,), generator=g).float()
    rewards = torch.zeros(PROMPTS * N, R)
    rewards[torch.arange(PROMPTS * N), lengths - 1] = scores
    rand = lambda *shape: torch.rand(*shape, generator=g)
    return AdvantageInput(
        token_rewards=rewards,
        mask=mask,
        index=[i // N for i in range(PROMPTS * N)],
        values=rand(PROMPTS * N, R) * mask,
        gamma=0.9,
        lam=0.8,
        norm_adv_by_std_in_grpo=True,
        allreduce=local,
        baselines=rand(PROMPTS * N),
        old_logp=-rand(PROMPTS * N, R) * mask,
        sum_pi_squared=rand(PROMPTS * N, R) * mask,
        is_weights=(0.5 + rand(PROMPTS * N, R)) * mask,
        components=torch.randint(0, 3, (PROMPTS * N, 2), generator=g).float(),
        component_weights=[1.0, 0.5],
    )


# the rows each data-parallel group holds: a prompt's samples on several of them, in no order
ORDER = torch.randperm(PROMPTS * N, generator=torch.Generator().manual_seed(1))


def _rows(x: AdvantageInput, rows: torch.Tensor) -> AdvantageInput:
    tensors = {f.name: getattr(x, f.name)[rows] for f in dataclasses.fields(x) if torch.is_tensor(getattr(x, f.name))}
    return dataclasses.replace(x, **tensors, index=[x.index[i] for i in rows.tolist()])


def _summed(t: torch.Tensor) -> torch.Tensor:
    dist.all_reduce(t)
    return t


def _worker(rank, world, sp, out_dir):
    from rlrig.trainer.batch.split_groups import peer_group, whole_batch_advantages

    peers = peer_group(rank, world, sp)
    groups = world // sp
    mine = ORDER.reshape(groups, -1)[rank // sp]
    # as the worker's own batch statistics would be: summed over every rank, each sample counted once per rank of
    # its sequence-parallel group
    x = dataclasses.replace(_rows(_whole_batch(), mine), allreduce=lambda t: _summed(t) / sp)
    out = {name: whole_batch_advantages(e.fn, x, peers) for name, e in sorted(ESTIMATORS.items())}
    torch.save({"rows": mine, "out": out}, os.path.join(out_dir, f"{rank}.pt"))


@pytest.mark.parametrize("world, sp", [(3, 1), (4, 2)])
def test_every_estimator_over_a_batch_split_between_workers_equals_it_over_the_whole_batch(tmp_path, world, sp):
    gloo_ranks.run(world, _worker, sp, str(tmp_path))
    whole = _whole_batch()
    expected = {name: e.fn(whole) for name, e in ESTIMATORS.items()}
    alone_differs = False
    for rank in range(world):
        got = torch.load(tmp_path / f"{rank}.pt")
        rows = got["rows"]
        assert len(rows) == PROMPTS * N // (world // sp)
        assert sorted(got["out"]) == sorted(ESTIMATORS)
        for name, (adv, ret) in got["out"].items():
            want_adv, want_ret = expected[name]
            assert torch.allclose(adv, want_adv[rows], atol=1e-6), (name, rank)
            assert torch.allclose(ret, want_ret[rows], atol=1e-6), (name, rank)
        alone = ESTIMATORS["grpo"].fn(_rows(whole, rows))[0]
        alone_differs |= not torch.allclose(alone, expected["grpo"][0][rows], atol=1e-6)
    assert alone_differs  # the groups are cut apart: a worker on its own rows would get other advantages
