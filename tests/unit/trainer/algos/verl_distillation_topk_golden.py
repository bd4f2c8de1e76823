"""Writes verl_distillation_topk_golden.json beside it: verl 0.9.1's own top-k distillation loss
(forward_kl_topk: verl/trainer/distillation/fsdp/losses.py compute_forward_kl_topk, the logits processor, then
losses.py's registered compute_forward_kl_topk and distillation_loss) on seeded random inputs, which
test_distillation_topk.py compares rlrig's with (the test needs neither verl nor its source): as a direct loss and
as a policy gradient, with and without log_prob_min_clamp and loss_max_clamp, under two loss_agg_modes, without a
global batch and with one (dp_size 2).

verl 0.9.1 (VERL_RELEASE in verl_source.py), read from its wheel unpacked (verl_source.py says how) and run by hand:

    .venv/bin/python tests/unit/trainer/algos/verl_distillation_topk_golden.py /tmp/verlwheel

The functions are cut out by name with ast and executed as in verl_distillation_golden.py; verl's nested (jagged)
teacher tensors stand as objects whose values() is the flat [N, K] (one sequence parallel rank), the student's
logits as [1, N, V] (N = rows x columns, every position), its outputs reshaped to [rows, columns]. Inputs in
float64: 4 rows x 6 columns, a vocabulary of 16, k = 5; one row without tokens, one mask with a hole.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbours
from verl_distillation_golden import Metric, draws, masked_start, number, r4  # noqa: E402
from verl_source import VerlConfig, cut, load_core_algos, wheel_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_distillation_topk_golden.json")
ROWS, COLS, VOCAB, K = 4, 6, 16, 5
AGG = ("token-mean", "seq-mean-token-mean")
GLOBAL = {"dp_size": 2, "batch_num_tokens": 31, "global_batch_size": 10}


class Nested:
    """verl's jagged teacher tensor as compute_forward_kl_topk reads it: is_nested, values() the flat tokens."""

    is_nested = True

    def __init__(self, flat: torch.Tensor):
        self.flat = flat

    def values(self) -> torch.Tensor:
        return self.flat


def load(root: str) -> tuple[dict, dict]:
    """(fsdp/losses.py's namespace, losses.py's): both name a compute_forward_kl_topk."""
    configs = {n: VerlConfig for n in ("ActorConfig", "DistillationConfig", "DistillationLossConfig")}
    fsdp: dict = {"torch": torch, "F": F, **configs}
    fsdp |= {"get_ulysses_sequence_parallel_world_size": lambda: 1, "slice_input_tensor": None}
    source = wheel_show(root, "verl/trainer/distillation/fsdp/losses.py")
    exec(cut(source, {"kl_divergence", "compute_forward_kl_topk", "_chunked_topk_log_probs"}), fsdp)
    core = load_core_algos(root, {"kl_penalty", "kl_penalty_forward", "agg_loss", "compute_policy_loss_vanilla"})
    ns: dict = {"torch": torch, "Any": Any, "Optional": Optional, "Metric": Metric, **configs}
    ns |= {"AggregationType": type("AggregationType", (), {"MIN": "min", "MAX": "max", "MEAN": "mean"})}
    ns |= {"TensorDict": dict, "no_padding_2_padding": lambda x, data: x, "agg_loss": core["agg_loss"]}
    ns["get_policy_loss_fn"] = lambda name: core["compute_policy_loss_vanilla"]
    names = {"distillation_loss", "compute_forward_kl_topk", "compute_distillation_loss_range"}
    exec(cut(wheel_show(root, "verl/trainer/distillation/losses.py"), names), ns)
    ns["get_distillation_loss_fn"] = lambda name: ns["compute_forward_kl_topk"]
    return fsdp, ns


def inputs(g: torch.Generator) -> dict[str, torch.Tensor]:
    rand = draws(g)
    mask, old = masked_start(g, ROWS, COLS)
    teacher = torch.log_softmax(rand(ROWS, COLS, VOCAB, scale=2.5), -1).topk(K, dim=-1)
    return {
        "mask": mask,
        "old_logp": old,
        "logp": old + rand(ROWS, COLS, scale=0.6),
        "student_logits": rand(ROWS, COLS, VOCAB, scale=2.0),
        "teacher_logp": r4(teacher.values),
        "teacher_ids": teacher.indices,
    }


def one(fsdp: dict, ns: dict, x: dict, agg: str, pg: bool, clamps: tuple, glob: bool) -> dict:
    min_clamp, max_clamp = clamps
    info = dict(GLOBAL) if glob else {}
    loss_cfg = VerlConfig(
        loss_mode="forward_kl_topk", topk=K, loss_max_clamp=max_clamp, log_prob_min_clamp=min_clamp,
        use_policy_gradient=pg, policy_loss_mode="vanilla", clip_ratio=0.2, clip_ratio_low=0.2,
        clip_ratio_high=0.28, global_batch_info={}, use_chunked_topk=False,
    )  # fmt: skip
    dcfg = VerlConfig(distillation_loss=loss_cfg)
    flat = lambda t: t.reshape(ROWS * COLS, *t.shape[2:])  # noqa: E731
    processed = fsdp["compute_forward_kl_topk"](
        student_logits=flat(x["student_logits"])[None],
        teacher_topk_log_probs=Nested(flat(x["teacher_logp"])),
        teacher_topk_ids=Nested(flat(x["teacher_ids"])),
        config=dcfg,
        data_format="thd",
    )
    model_output = {k: v.reshape(ROWS, COLS) for k, v in processed.items()}
    model_output["log_probs"] = x["logp"]
    actor = VerlConfig(loss_agg_mode=agg, loss_scale_factor=None, global_batch_info={})
    data = {"response_mask": x["mask"], "old_log_probs": x["old_logp"]}
    data |= {"dp_size": info.get("dp_size", 1), "batch_num_tokens": info.get("batch_num_tokens")}
    data["global_batch_size"] = info.get("global_batch_size")
    loss, metrics = ns["distillation_loss"](actor, dcfg, model_output, data)
    return {
        "agg": agg, "use_policy_gradient": pg, "log_prob_min_clamp": min_clamp, "loss_max_clamp": max_clamp,
        "global": info or None, "k": K,
        **{k: x[k].tolist() for k in ("mask", "old_logp", "logp", "student_logits", "teacher_logp", "teacher_ids")},
        "verl": number(loss), "verl_metrics": {k: number(v) for k, v in metrics.items()},
    }  # fmt: skip


def main(wheel: str) -> None:
    fsdp, ns = load(wheel)
    cases = []
    for j, agg in enumerate(AGG):
        for pg in (False, True):
            for c, clamps in enumerate(((None, None), (-3.0, None), (-3.0, 0.5), (None, 0.5))):
                for glob in (False, True):
                    g = torch.Generator().manual_seed(1700 + 32 * j + 16 * pg + 4 * c + glob)
                    cases.append(one(fsdp, ns, inputs(g), agg, pg, clamps, glob))
    write_fixture(OUT, {"forward_kl_topk": cases}, release=True)


if __name__ == "__main__":
    main(sys.argv[1])
