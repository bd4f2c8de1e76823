"""Activation offload (model.enable_activation_offload, as verl): what each transformer block saves for its backward,
other than its own weights, is copied to pinned host memory as the training forward saves it and back to the GPU when
the backward reads it. A 7B update then holds a block's activations on the GPU, not every block's, at the cost of
two copies over PCIe per saved tensor.

As in verl, with gradient checkpointing on, transformers' own checkpointing is switched off and each block is
checkpointed here with the reentrant variant instead: it saves the block's inputs through autograd's saved-tensor
hooks, so those inputs go to host memory too (the non-reentrant variant keeps them in a closure the hooks never see).
Then the GPU holds one block's inputs and recompute at a time.

The copies out run on a side stream, so the next block computes while the last one's tensors leave; the copies back
run on the compute stream when the backward asks. On CPU nothing moves: the activations are in host memory already.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from . import parallel, ulysses
from .transformers_api import CACHE_ARGS


def on_device(t: torch.Tensor) -> bool:
    return t.device.type != "cpu"


class Offloader:
    """The pack/unpack pair of autograd's saved-tensor hooks, active inside a block's training forward. `moves` says
    which tensors leave (tests hand in their own); the block's gathered weights never do: the backward needs them on
    the device anyway, and FSDP frees them itself."""

    def __init__(self, moves: Callable[[torch.Tensor], bool] = on_device):
        self.moves = moves
        self.weights: set[int] = set()  # storages of the running block's parameters (FSDP's gathered ones)
        self.moved_bytes = 0  # what went to host memory in all
        self._streams: dict[torch.device, torch.cuda.Stream] = {}

    def pack(self, t: torch.Tensor):
        if not self.moves(t) or t.untyped_storage().data_ptr() in self.weights:
            return t
        pin = t.device.type == "cuda"
        host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pin)
        self.moved_bytes += t.numel() * t.element_size()
        if not pin:
            host.copy_(t)
            return (t.device, host, None)
        side = self._streams.setdefault(t.device, torch.cuda.Stream(t.device))
        side.wait_stream(torch.cuda.current_stream(t.device))  # the tensor is written before it is read
        with torch.cuda.stream(side):
            host.copy_(t, non_blocking=True)
        t.record_stream(side)  # the allocator keeps its memory until the copy has read it
        done = torch.cuda.Event()
        done.record(side)
        return (t.device, host, done)

    @staticmethod
    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        device, host, done = packed
        if done is not None:
            torch.cuda.current_stream(device).wait_event(done)
        return host.to(device, non_blocking=done is not None)


def enable(module: torch.nn.Module, checkpointing: bool, offloader: Offloader | None = None) -> Offloader:
    """Offload every block's saved activations in training forwards; with `checkpointing`, checkpoint each block here
    (the caller leaves transformers' checkpointing off). Eval-mode and no-grad forwards (generation, log-prob passes)
    run as before."""
    off = offloader or Offloader()
    for block in parallel.blocks(module):
        block.forward = _offloaded(block, block.forward, off, checkpointing)
    return off


def _offloaded(block: torch.nn.Module, forward, off: Offloader, checkpointing: bool):
    @functools.wraps(forward)
    def run(*args, **kwargs):
        if not (block.training and torch.is_grad_enabled()):
            return forward(*args, **kwargs)
        off.weights = {p.untyped_storage().data_ptr() for p in block.parameters()}
        with torch.autograd.graph.saved_tensors_hooks(off.pack, off.unpack):
            if not checkpointing:
                return forward(*args, **kwargs)
            if not getattr(block, "_can_checkpoint_with_cache", False):
                # as transformers' checkpointing: the recompute would write a key/value cache a second time
                off_cache = {**dict.fromkeys(CACHE_ARGS), "use_cache": False}
                kwargs = {k: off_cache.get(k, v) for k, v in kwargs.items()}
            return _reentrant(forward, args, kwargs)

    return run


def _reentrant(forward, args: tuple, kwargs: dict):
    """forward(*args, **kwargs) under reentrant checkpointing, which takes positional arguments only."""
    keys = tuple(kwargs)
    flat = [*args, *kwargs.values()]
    if not any(isinstance(a, torch.Tensor) and a.requires_grad for a in flat):
        # frozen embeddings (LoRA): reentrant checkpointing passes gradients only through inputs that need them, so
        # the hidden states must, as peft's enable_input_require_grads makes them for transformers' checkpointing
        first = 0 if args else keys.index("hidden_states")
        flat[first] = flat[first].detach().requires_grad_()
    # the recompute of a sequence-parallel block attends over its group again (model/ulysses.py)
    first_pass, recompute = ulysses.checkpoint_contexts()
    n_args = len(flat) - len(keys)

    def call(*inputs):
        # reentrant checkpointing runs this under no_grad in the forward and under grad in the recompute
        with recompute if torch.is_grad_enabled() else first_pass:
            return forward(*inputs[:n_args], **dict(zip(keys, inputs[n_args:], strict=True)))

    return checkpoint(call, *flat, use_reentrant=True)
