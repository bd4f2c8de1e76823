"""Writes verl_losses_golden.json beside it: verl's own loss functions on seeded random inputs, which
test_verl_losses.py compares rlrig's with (the test needs neither verl nor its source): agg_loss without a global
batch, every registered policy loss rlrig also has, the value loss and the entropy loss, each under every
loss_agg_mode, without a global batch and with one (dp_size 2, as verl's engine workers pass global_batch_info).

verl 0.9.1 (VERL_RELEASE in verl_source.py), read from its wheel unpacked (verl_source.py says how) and run by hand:

    .venv/bin/python tests/unit/trainer/algos/verl_losses_golden.py /tmp/verlwheel

It executes, cut out by name with ast, core_algos.py's functions and torch_functional.py's masked_sum, masked_mean,
clip_by_value and entropy_from_logits. Inputs in float64: 4 rows x 6 columns, one row without tokens, one mask with
a hole; log-ratios wide enough to reach the clip and dual-clip bounds; rollout-correction weights in half the policy
cases. clip_cov is left out: it draws the tokens it cuts at random.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import VerlConfig, load_core_algos, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_losses_golden.json")
ROWS, COLS = 4, 6
MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
# the mini batch this micro batch belongs to over 2 ranks: verl's global_batch_info
GLOBAL = {"dp_size": 2, "batch_num_tokens": 31, "global_batch_size": 10, "loss_scale_factor": None}
LOSSES = {
    "vanilla": "compute_policy_loss_vanilla",
    "gspo": "compute_policy_loss_gspo",
    "sapo": "compute_policy_loss_sapo",
    "gpg": "compute_policy_loss_gpg",
    "geo_mean": "compute_policy_loss_geo_mean",
    "cispo": "compute_policy_loss_cispo",
    "kl_cov": "compute_policy_loss_kl_cov",
    "dro": "compute_policy_loss_dro",
}
# the actor's keys the losses read, as rlrig's ActorConfig names them (policy_loss.* under policy_loss)
ACTOR = {"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}
ACTOR |= {"tau_pos": 1.0, "tau_neg": 1.05}
POLICY_LOSS = {"kl_cov_ratio": 0.2, "ppo_kl_coef": 0.1, "dro_beta": 0.3}


def r4(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t * 1e4) / 1e4


def inputs(g: torch.Generator) -> dict[str, list]:
    def rand(*shape, scale=1.0):
        return r4(torch.randn(*shape, generator=g, dtype=torch.float64) * scale)

    lengths = torch.randint(1, COLS + 1, (ROWS,), generator=g)
    mask = (torch.arange(COLS)[None] < lengths[:, None]).to(torch.float64)
    mask[1] = 0
    mask[2, 0] = 0
    old = rand(ROWS, COLS) - 1.5
    return {
        "loss": rand(ROWS, COLS),
        "mask": mask,
        "old_logp": old,
        "logp": old + rand(ROWS, COLS, scale=0.6),
        "adv": rand(ROWS, COLS, scale=1.5),
        "weights": r4(torch.rand(ROWS, COLS, generator=g, dtype=torch.float64) * 1.5 + 0.25),
        "values": rand(ROWS, COLS),
        "old_values": rand(ROWS, COLS),
        "returns": rand(ROWS, COLS),
        "logits": rand(ROWS, COLS, 5, scale=2.0),
    }


def config(glob: bool) -> VerlConfig:
    return VerlConfig(ACTOR, policy_loss=VerlConfig(POLICY_LOSS), global_batch_info=dict(GLOBAL) if glob else {})


def number(v) -> float:
    return float(v.item() if torch.is_tensor(v) else v)


def main(wheel: str) -> None:
    names = {"agg_loss", "compute_value_loss", "compute_entropy_loss", *LOSSES.values()}
    ns = load_core_algos(wheel, names)
    agg_cases, policy_cases, value_cases, entropy_cases = [], [], [], []
    for i, mode in enumerate(MODES):
        for glob in (False, True):
            g = torch.Generator().manual_seed(700 + 2 * i + glob)
            x = inputs(g)
            info = GLOBAL if glob else {}
            case = {"mode": mode, "global": info or None}
            agg_cases.append(
                case
                | {k: x[k].tolist() for k in ("loss", "mask")}
                | {"verl": ns["agg_loss"](x["loss"], x["mask"], mode, **info).item()}
            )
            vf, vclip = ns["compute_value_loss"](
                vpreds=x["values"],
                returns=x["returns"],
                values=x["old_values"],
                response_mask=x["mask"],
                cliprange_value=0.2,
                loss_agg_mode=mode,
                **info,
            )
            value_cases.append(
                case
                | {k: x[k].tolist() for k in ("values", "old_values", "returns", "mask")}
                | {"cliprange_value": 0.2, "verl": [vf.item(), vclip.item()]}
            )
            if not glob:  # verl's compute_entropy_loss takes no global batch (its engine's entropy is agg_loss's)
                ent = ns["compute_entropy_loss"](x["logits"], x["mask"], mode)
                entropy_cases.append(case | {k: x[k].tolist() for k in ("logits", "mask")} | {"verl": ent.item()})
            for j, (name, fn) in enumerate(LOSSES.items()):
                weights = x["weights"] if (i + j) % 2 else None
                loss, metrics = ns[fn](
                    old_log_prob=x["old_logp"],
                    log_prob=x["logp"],
                    advantages=x["adv"],
                    response_mask=x["mask"],
                    loss_agg_mode=mode,
                    config=config(glob),
                    rollout_is_weights=weights,
                )
                policy_cases.append(
                    case
                    | {"loss_mode": name}
                    | {k: x[k].tolist() for k in ("old_logp", "logp", "adv", "mask")}
                    | {"weights": None if weights is None else weights.tolist()}
                    | {"verl": number(loss), "verl_metrics": {k: number(v) for k, v in metrics.items()}}
                )
    write_fixture(
        OUT,
        {"agg_loss": agg_cases, "policy_loss": policy_cases, "value_loss": value_cases, "entropy": entropy_cases},
        release=True,
    )


if __name__ == "__main__":
    main(sys.argv[1])
