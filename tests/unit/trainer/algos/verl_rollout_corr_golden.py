"""Writes verl_rollout_corr_golden.json beside it: verl's own rollout-correction functions on seeded random inputs,
which test_rollout_correction.py compares rlrig's with (the test needs neither verl nor its source).

verl commit b178a3cd56f58b2d502255daba591e92833930a7. verl is not installed here (it needs Ray, vLLM, omegaconf,
tensordict...), so the script reads its source from git and runs it by hand: run, at a new pin after updating
VERL_COMMIT (verl_source.py),

    .venv/bin/python tests/unit/trainer/algos/verl_rollout_corr_golden.py /path/to/verl

(a bare git directory or a checkout). It executes verl/trainer/ppo/rollout_corr_helper.py whole, and from
verl/trainer/ppo/core_algos.py and verl/utils/torch_functional.py only the functions it calls (cut out by name
with ast), with verl's imports they reach for stubbed with the little they use (DataProto.from_dict, the config
classes, the actor config's attributes and .get).

Cases, all in float64 on [6, 8] batches with random response lengths (a row without tokens in some):
- rejection: compute_rollout_rejection_mask for every rollout_rs option, and verl's spellings of several options
  (comma-separated, duplicates, spaces) and of thresholds (lower_upper, one number for a k1 option, one shared
  threshold): the new mask and every metric;
- weights: compute_rollout_correction_weights, token and sequence, with and without batch normalization;
- bypass: compute_policy_loss_bypass_mode (bypass mode's loss) for loss_type ppo_clip and reinforce, with and
  without rollout_is and rollout_rs, in three aggregation modes: the loss, its gradient with respect to the
  current log-probs, and its metrics.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import cut, git_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_rollout_corr_golden.json")
ROWS, COLS = 6, 8
ACTOR = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}

REJECTION = [  # (rollout_rs, rollout_rs_threshold, noise of the log ratio)
    ("token_k1", "0.8_1.25", 0.3),
    ("token_k2", 0.02, 0.3),
    ("token_k3", "0.02", 0.3),
    ("seq_sum_k1", "0.7_1.4", 0.3),
    ("seq_sum_k2", 0.15, 0.3),
    ("seq_sum_k3", 0.15, 0.3),
    ("seq_mean_k1", "0.95_1.05", 0.1),
    ("seq_mean_k2", 0.02, 0.2),
    ("seq_mean_k3", 0.02, 0.2),
    ("seq_max_k2", 0.08, 0.2),
    ("seq_max_k3", 0.03, 0.2),
    ("token_k1", 1.3, 0.3),  # one number for k1: the upper ratio, its reciprocal the lower
    ("seq_mean_k1", "1.05", 0.1),
    ("token_k1,seq_max_k2", "0.6_1.6,2.5", 0.5),  # verl's example script
    ("token_k1,seq_max_k2", "0.8_1.25,0.1", 0.3),
    ("seq_mean_k1,seq_max_k3", "0.8_1.2,3.0", 0.4),
    (" token_k2 , token_k2,seq_sum_k1", "0.05, 0.5_2.0", 0.3),  # the duplicate dropped: two thresholds
    ("token_k3,seq_mean_k2,seq_sum_k3", 0.05, 0.3),  # one threshold for all three
]
WEIGHTS = [("token", 2.0, False), ("token", 1.5, True), ("sequence", 2.0, False), ("sequence", 3.0, True)]
BYPASS = [  # (loss_type, rollout_is, batch_normalize, rollout_rs, rollout_rs_threshold, loss_agg_mode)
    ("ppo_clip", None, False, None, None, "token-mean"),
    ("ppo_clip", "token", False, None, None, "token-mean"),
    ("ppo_clip", None, False, "token_k1", "0.8_1.25", "token-mean"),
    ("ppo_clip", "sequence", False, "seq_mean_k3", 0.01, "seq-mean-token-mean"),
    ("ppo_clip", None, False, "token_k1,seq_max_k2", "0.6_1.6,2.5", "seq-mean-token-sum"),
    ("reinforce", None, False, None, None, "token-mean"),
    ("reinforce", "token", False, None, None, "token-mean"),
    ("reinforce", "sequence", True, None, None, "seq-mean-token-mean"),
    ("reinforce", "token", True, "seq_mean_k1", "0.9_1.1", "token-mean"),
    ("reinforce", "sequence", False, "token_k2", 0.02, "seq-mean-token-sum"),
    ("reinforce", None, False, "seq_sum_k3", 0.2, "token-mean"),
]


def module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


class DataProto:
    def __init__(self, batch: dict):
        self.batch = batch

    @classmethod
    def from_dict(cls, tensors: dict) -> DataProto:
        return cls(dict(tensors))


class ActorConfig:
    """What verl's policy losses read of the actor config."""

    def __init__(self, rollout_correction: dict, **fields):
        self.__dict__.update(fields)
        self.policy_loss = {"rollout_correction": rollout_correction}
        self.global_batch_info: dict = {}  # the legacy FSDP actor's: each micro batch aggregates on its own

    def get(self, key: str, default=None):
        return getattr(self, key, default)


class AlgoConfig:
    pass


def load_verl(repo: str) -> tuple[types.ModuleType, dict]:
    """(rollout_corr_helper as a module, the namespace holding core_algos' policy losses)."""
    for name in ("verl", "verl.utils", "verl.trainer", "verl.trainer.ppo", "verl.trainer.config", "verl.workers"):
        module(name)
    verl_f = module("verl.utils.torch_functional", torch=torch)
    tf = git_show(repo, "verl/utils/torch_functional.py")
    exec(cut(tf, {"masked_sum", "masked_mean", "distributed_masked_mean"}), verl_f.__dict__)
    module("verl.protocol", DataProto=DataProto)
    module("verl.trainer.config.algorithm", RolloutCorrectionConfig=dict)
    module("verl.workers.config", ActorConfig=ActorConfig)
    module("verl.workers.config.actor", PolicyLossConfig=dict)
    helper = module("verl.trainer.ppo.rollout_corr_helper")
    helper.__file__ = "verl/trainer/ppo/rollout_corr_helper.py"
    exec(compile(git_show(repo, helper.__file__), helper.__file__, "exec"), helper.__dict__)
    core: dict = {"torch": torch, "verl_F": verl_f, "Optional": Optional, "Any": Any}
    core.update(ActorConfig=ActorConfig, AlgoConfig=AlgoConfig)
    losses = {"agg_loss", "compute_policy_loss_vanilla", "compute_policy_loss_reinforce"}
    exec(cut(git_show(repo, "verl/trainer/ppo/core_algos.py"), losses | {"compute_policy_loss_bypass_mode"}), core)
    return helper, core


def inputs(seed: int, noise: float, empty_row: bool) -> dict[str, torch.Tensor]:
    """Old (training) and engine log-probs, advantages and a response mask, [ROWS, COLS] in float64."""
    g = torch.Generator().manual_seed(seed)
    old = -3 * torch.rand(ROWS, COLS, generator=g, dtype=torch.float64)
    engine = old + noise * torch.randn(ROWS, COLS, generator=g, dtype=torch.float64)
    lengths = torch.randint(1, COLS + 1, (ROWS,), generator=g)
    mask = (torch.arange(COLS)[None] < lengths[:, None]).to(torch.float64)
    if empty_row:
        mask[ROWS - 1] = 0
    adv = torch.randn(ROWS, COLS, generator=g, dtype=torch.float64) * mask
    short = lambda t: torch.round(t * 1e4) / 1e4  # noqa: E731  (four decimals: the fixture stays small, exact)
    return {"old": short(old), "engine": short(engine), "mask": mask, "adv": short(adv)}


def listed(d: dict) -> dict:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in d.items()}


def main(repo: str) -> None:
    helper, core = load_verl(repo)
    cases: dict[str, list] = {"rejection": [], "weights": [], "bypass": []}
    for i, (rs, threshold, noise) in enumerate(REJECTION):
        x = inputs(100 + i, noise, empty_row=i % 3 == 0)
        kept, metrics = helper.compute_rollout_rejection_mask(x["old"] - x["engine"], x["mask"], rs, threshold)
        rejected = int((x["mask"] - kept).sum())
        print(f"rejection {rs!r} {threshold!r}: {rejected} of {int(x['mask'].sum())} tokens rejected")
        cases["rejection"].append(
            {"rollout_rs": rs, "threshold": threshold, **listed(x), "kept": kept.tolist(), "metrics": metrics}
        )
    for i, (level, threshold, normalize) in enumerate(WEIGHTS):
        x = inputs(200 + i, 0.4, empty_row=i % 2 == 1)
        w, metrics = helper.compute_rollout_correction_weights(
            x["old"] - x["engine"], x["mask"], level, threshold, normalize
        )
        cases["weights"].append(
            {"rollout_is": level, "threshold": threshold, "batch_normalize": normalize, **listed(x)}
            | {"is_weights": w.tolist(), "metrics": metrics}
        )
    for i, (loss_type, level, normalize, rs, rs_threshold, agg) in enumerate(BYPASS):
        x = inputs(300 + i, 0.3, empty_row=i % 4 == 3)
        rc = {"loss_type": loss_type, "rollout_is": level, "rollout_is_threshold": 2.0}
        rc |= {"rollout_is_batch_normalize": normalize, "rollout_rs": rs, "rollout_rs_threshold": rs_threshold}
        logp = x["old"].clone().requires_grad_(True)  # the current policy; the old log-probs are the engine's
        loss, metrics = core["compute_policy_loss_bypass_mode"](
            x["engine"], logp, x["adv"], x["mask"], agg, ActorConfig(rc, **ACTOR), None
        )
        loss.backward()
        cases["bypass"].append(
            {**rc, "loss_agg_mode": agg, "actor": ACTOR, **listed(x)}
            | {"loss": loss.item(), "grad": logp.grad.tolist(), "metrics": metrics}
        )
    write_fixture(OUT, cases)


if __name__ == "__main__":
    main(sys.argv[1])
