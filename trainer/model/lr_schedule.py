"""The learning-rate schedule (optim.lr_warmup_steps[_ratio], lr_scheduler_type / warmup_style,
min_lr_ratio, num_cycles) as verl computes it, as a pure function of the step: a resumed run gets
the same rate at the same step with no scheduler state to save."""

from __future__ import annotations

import math


def warmup_steps(optim, total_steps: int) -> int:
    # lr_warmup_steps < 0: the ratio of the total decides (verl)
    return optim.lr_warmup_steps if optim.lr_warmup_steps >= 0 else int(optim.lr_warmup_steps_ratio * total_steps)


def lr_factor(
    step: int, total_steps: int, warmup: int, style: str, min_lr_ratio: float = 0.0, num_cycles: float = 0.5
) -> float:
    """The multiplier of optim.lr for the update of 0-based `step`.
    constant: step / warmup during warm-up, then 1.
    cosine: min + (1 - min) * step / warmup during warm-up; then with p = (step - warmup) / (total - warmup),
    max(min, min + (1 - min) * 0.5 * (1 + cos(2 pi num_cycles p)))."""
    if style == "constant":
        return step / max(1, warmup) if step < warmup else 1.0
    if step < warmup:
        return min_lr_ratio + (1 - min_lr_ratio) * step / max(1, warmup)
    progress = (step - warmup) / max(1, total_steps - warmup)
    return max(
        min_lr_ratio, min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(2 * math.pi * num_cycles * progress))
    )


def lr_at(optim, step: int, total_steps: int) -> float:
    style = optim.warmup_style or optim.lr_scheduler_type
    if style == "cosine" and not optim.zero_indexed_step:  # verl hands zero_indexed_step to its cosine schedule only
        step += 1
    return optim.lr * lr_factor(
        step, total_steps, warmup_steps(optim, total_steps), style, optim.min_lr_ratio, optim.num_cycles
    )


def apply(opt, lr: float) -> None:
    for group in opt.param_groups:
        group["lr"] = lr
