"""PF-PPO (algorithm.use_pf_ppo): verl's weights on hand-worked scores, the draw over the whole batch across two
real Gloo processes whose prompts are padded differently, and training steps through the worker."""

import json
import subprocess
import sys

import pytest
import torch

from rlrig.trainer.algos import pf_ppo as P
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

pytestmark = pytest.mark.process

E = 1e-8


@pytest.mark.parametrize(
    "scores, method, pow_, expected",
    [
        ([-2.0, 1.0, 0.0], "pow", 2.0, [4.0 + E, 1.0 + E, E]),  # |s| ** 2
        ([-2.0, 1.0, 0.5], "pow", 1.0, [2.0 + E, 1.0 + E, 0.5 + E]),
        ([3.0, 1.0, 3.0, 0.0], "max_min", 2.0, [1.0 + E, E, 1.0 + E, 1.0 + E]),  # the highest and the lowest only
        ([1.0, 0.0, 1.0], "max_random", 2.0, [0.4 + E, 0.1 + E, 0.4 + E]),
    ],
)
def test_weights_by_hand(scores, method, pow_, expected):
    torch.testing.assert_close(P.weights(torch.tensor(scores), method, pow_), torch.tensor(expected))


def test_draw_follows_the_weights_and_the_seed():
    scores = torch.tensor([1.0, 0.5, 0.0, 0.5])
    idx = P.draw(scores, "max_min", 2.0, torch.Generator().manual_seed(3))
    assert len(idx) == 4 and set(idx.tolist()) <= {0, 2}  # the middle scores weigh 1e-8
    assert torch.equal(idx, P.draw(scores, "max_min", 2.0, torch.Generator().manual_seed(3)))


@pytest.mark.parametrize(
    "overrides, words",
    [
        (
            ["algorithm.use_pf_ppo=True", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"],
            "algorithm.use_pf_ppo=True: verl resamples only after adv_estimator=gae",
        ),
        (["algorithm.use_pf_ppo=True", "algorithm.pf_ppo.reweight_method=top"], "algorithm.pf_ppo.reweight_method"),
    ],
)
def test_pf_ppo_refusals(overrides, words):
    with pytest.raises(ConfigError) as e:
        parse_overrides(overrides)
    assert words in str(e.value) and "\n" not in str(e.value)


WORKER = """
import json, sys
import torch, torch.distributed as dist
from rlrig.trainer.batch.exchange import pf_ppo_resample
from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.rollout.engines.base import Rollout
rank, init = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=2)
# rank 0's prompts are 2 wide, rank 1's 3 wide; each row's tokens name its owner and row: 100 * rank + 10 * row
plen = 2 + rank
rows = torch.arange(3)
base = 100 * rank + 10 * rows
ids = torch.cat([base[:, None].repeat(1, plen) + torch.arange(plen), base[:, None] + 7], 1)
ro = Rollout(ids, torch.ones_like(ids), torch.ones(3, 1, dtype=torch.bool), plen, None)
scores = torch.tensor([[1.0, 0.2, 0.0], [0.5, 3.0, 0.1]][rank])
batch = StepBatch.from_rollout(ro, 1).replace(advantages=base.float()[:, None], token_scores=scores[:, None])
out = pf_ppo_resample(batch, "pow", 2.0, 11, -1)
print(json.dumps({"ids": out.input_ids.tolist(), "mask": out.attention_mask.tolist(), "plen": out.prompt_len,
                  "adv": out.advantages[:, 0].tolist(), "none": out.values}), flush=True)
dist.destroy_process_group()  # Gloo's threads joined before exit (else C++ may abort the process as it ends)
"""


def test_the_draw_spans_the_workers_and_each_keeps_its_share(tmp_path):
    (tmp_path / "w.py").write_text(WORKER)
    procs = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "w.py"), str(r), str(tmp_path / "init")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    res = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    # the same draw every worker makes: over all six scores, in rank order
    idx = P.draw(torch.tensor([1.0, 0.2, 0.0, 0.5, 3.0, 0.1]), "pow", 2.0, torch.Generator().manual_seed(11)).tolist()
    for rank in range(2):
        got = res[rank]
        assert got["plen"] == 3 and got["none"] is None
        for row, i in enumerate(idx[rank * 3 : (rank + 1) * 3]):
            owner, k = divmod(i, 3)
            base = 100 * owner + 10 * k
            prompt = [base + j for j in range(2 + owner)]
            assert got["ids"][row] == [-1] * (1 - owner) + prompt + [base + 7], (rank, row, i)  # re-padded on the left
            assert got["mask"][row] == [0] * (1 - owner) + [1] * (3 + owner)
            assert got["adv"][row] == base


def test_steps_with_pf_ppo():
    from rlrig.trainer.driver.single_process import run_steps

    ms = run_steps(
        [
            "algorithm.use_pf_ppo=True",
            "algorithm.pf_ppo.reweight_method=max_random",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "data.max_response_length=8",
        ],
        2,
    )
    assert all("timing_s/pf_ppo" in m and m["critic/score/max"] >= m["critic/score/min"] for m in ms)
