"""CPU offload between phases, as verl's fsdp_config keys ask: the optimizer's state (Adam's two
moments, twice the model in fp32) lives in host memory except while it steps, and the frozen
reference's weights except during its pass. On CPU both are no-ops."""

from __future__ import annotations

from contextlib import contextmanager

import torch


def move_optimizer_state(opt: torch.optim.Optimizer, device) -> None:
    for state in opt.state.values():
        for k, v in state.items():
            if isinstance(v, torch.Tensor) and k != "step":  # Adam's step counter stays where it was created
                state[k] = v.to(device, non_blocking=True)
    if torch.device(device).type == "cpu" and torch.cuda.is_available():
        torch.cuda.synchronize()  # the copies must land before the GPU memory is reused


@contextmanager
def optimizer_on(opt: torch.optim.Optimizer, device, offload: bool):
    """The optimizer's state on `device` inside the block, and back in host memory after it when offloaded."""
    if offload:
        move_optimizer_state(opt, device)
    try:
        yield
    finally:
        if offload:
            move_optimizer_state(opt, "cpu")


@contextmanager
def module_on(module: torch.nn.Module, device, offload: bool):
    if offload:
        module.to(device)
    try:
        yield
    finally:
        if offload:
            module.to("cpu")
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
