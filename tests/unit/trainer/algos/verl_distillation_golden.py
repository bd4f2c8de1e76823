"""Writes verl_distillation_golden.json beside it: verl 0.9.1's own on-policy distillation loss
(verl/trainer/distillation/losses.py: distillation_loss with compute_distillation_loss_reverse_kl_estimator and
compute_distillation_loss_range) on seeded random inputs, which test_distillation.py compares rlrig's with (the
test needs neither verl nor its source): every estimator mode, as a direct loss and as a policy gradient, with and
without loss_max_clamp, under two loss_agg_modes, without a global batch and with one (dp_size 2).

verl 0.9.1 (VERL_RELEASE in verl_source.py), read from its wheel unpacked (verl_source.py says how) and run by hand:

    .venv/bin/python tests/unit/trainer/algos/verl_distillation_golden.py /tmp/verlwheel

losses.py's functions are cut out by name with ast and executed with core_algos.py's kl_penalty, agg_loss and
compute_policy_loss_vanilla; verl's TensorDict batch is a dict of padded tensors (no_padding_2_padding is then the
identity), its Metric keeps the value. Inputs in float64: 4 rows x 6 columns, one row without tokens, one mask
with a hole; log-ratios wide enough to reach k3's clamp, the clip and the dual clip.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import VerlConfig, cut, load_core_algos, wheel_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_distillation_golden.json")
ROWS, COLS = 4, 6
MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
AGG = ("token-mean", "seq-mean-token-mean")
GLOBAL = {"dp_size": 2, "batch_num_tokens": 31, "global_batch_size": 10}
FUNCTIONS = {"distillation_loss", "compute_distillation_loss_reverse_kl_estimator", "compute_distillation_loss_range"}


class Metric:
    def __init__(self, aggregation=None, value=None):
        self.value = value


def load(root: str) -> dict:
    core = load_core_algos(root, {"kl_penalty", "kl_penalty_forward", "agg_loss", "compute_policy_loss_vanilla"})
    ns: dict = {"torch": torch, "Any": Any, "Optional": Optional, "Metric": Metric}
    ns |= {"AggregationType": type("AggregationType", (), {"MIN": "min", "MAX": "max", "MEAN": "mean"})}
    ns |= {n: VerlConfig for n in ("ActorConfig", "DistillationConfig", "DistillationLossConfig")}
    ns |= {"TensorDict": dict, "no_padding_2_padding": lambda x, data: x}
    ns |= {k: core[k] for k in ("kl_penalty", "agg_loss")}
    ns["get_policy_loss_fn"] = lambda name: core["compute_policy_loss_vanilla"]
    exec(cut(wheel_show(root, "verl/trainer/distillation/losses.py"), FUNCTIONS), ns)
    ns["get_distillation_loss_fn"] = lambda name: ns["compute_distillation_loss_reverse_kl_estimator"]
    return ns


def r4(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t * 1e4) / 1e4


def draws(g: torch.Generator):
    """rand(*shape, scale): normal draws from `g`, in float64, rounded as the fixture stores them."""

    def rand(*shape, scale=1.0):
        return r4(torch.randn(*shape, generator=g, dtype=torch.float64) * scale)

    return rand


def masked_start(g: torch.Generator, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first draws of both fixtures' inputs: the loss mask (one row without tokens, one with a hole) and the old
    log-probs."""
    lengths = torch.randint(1, cols + 1, (rows,), generator=g)
    mask = (torch.arange(cols)[None] < lengths[:, None]).to(torch.float64)
    mask[1] = 0
    mask[2, 0] = 0
    return mask, draws(g)(rows, cols) - 1.5


def inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    rand = draws(g)
    mask, old = masked_start(g, ROWS, COLS)
    return {
        "mask": mask,
        "old_logp": old,
        "logp": old + rand(ROWS, COLS, scale=0.6),
        "teacher_logp": old + rand(ROWS, COLS, scale=3.0),  # far enough for k3's clamp at 10
        "weights": r4(torch.rand(ROWS, COLS, generator=g, dtype=torch.float64) * 1.5 + 0.25),
    }


def number(v) -> float:
    v = v.value if isinstance(v, Metric) else v
    return float(v.item() if torch.is_tensor(v) else v)


def one(ns: dict, x: dict, mode: str, agg: str, pg: bool, clamp, glob: bool, weighted: bool) -> dict:
    info = dict(GLOBAL) if glob else {}
    loss_cfg = VerlConfig(
        loss_mode=mode, loss_max_clamp=clamp, use_policy_gradient=pg, policy_loss_mode="vanilla",
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, global_batch_info={},
    )  # fmt: skip
    actor = VerlConfig(loss_agg_mode=agg, loss_scale_factor=None, global_batch_info={})
    data = {"response_mask": x["mask"], "old_log_probs": x["old_logp"], "teacher_logprobs": x["teacher_logp"]}
    data |= {"dp_size": info.get("dp_size", 1), "batch_num_tokens": info.get("batch_num_tokens")}
    data["global_batch_size"] = info.get("global_batch_size")
    if weighted:
        data["rollout_is_weights"] = x["weights"]
    if not glob:  # verl's agg_loss without a global batch: the micro batch's own counts
        data |= {"dp_size": 1, "batch_num_tokens": None, "global_batch_size": None}
    loss, metrics = ns["distillation_loss"](
        actor, VerlConfig(distillation_loss=loss_cfg), {"log_probs": x["logp"]}, data
    )
    return {
        "loss_mode": mode, "agg": agg, "use_policy_gradient": pg, "loss_max_clamp": clamp,
        "global": info or None, "weighted": weighted,
        **{k: x[k].tolist() for k in ("mask", "old_logp", "logp", "teacher_logp")},
        "weights": x["weights"].tolist() if weighted else None,
        "verl": number(loss), "verl_metrics": {k: number(v) for k, v in metrics.items()},
    }  # fmt: skip


def main(wheel: str) -> None:
    ns = load(wheel)
    cases = []
    for i, mode in enumerate(MODES):
        for j, agg in enumerate(AGG):
            for pg in (False, True):
                for clamp in (None, 2.0):
                    for glob in (False, True):
                        g = torch.Generator().manual_seed(900 + 16 * i + 8 * j + 4 * pg + 2 * (clamp is None) + glob)
                        cases.append(one(ns, inputs(g), mode, agg, pg, clamp, glob, pg and (i + j) % 2 == 1))
    write_fixture(OUT, {"distillation_loss": cases}, release=True)


if __name__ == "__main__":
    main(sys.argv[1])
