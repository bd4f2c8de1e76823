"""Mixed precision as verl sets it up: fp32 master weights, optimizer state and gradient reduction,
bf16 matrix products on GPU, for the reference too (verl's generated config); CPU stays fp32 unless asked.

FSDP2 casts the sharded fp32 parameters to the compute dtype for each forward (MixedPrecisionPolicy);
DDP has no such policy, so its forwards run under torch.autocast, which gives the same split: fp32
weights and gradients, bf16 products.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Precision:
    model_dtype: torch.dtype  # what the weights (and so the optimizer state) are held in
    buffer_dtype: torch.dtype  # buffers such as rotary frequencies
    param_dtype: torch.dtype  # what the forward computes in
    reduce_dtype: torch.dtype  # what gradients are all-reduced in
    device_type: str
    strategy: str  # ddp | fsdp: FSDP casts by its policy, DDP by autocast

    @property
    def mixed(self) -> bool:
        return self.param_dtype != self.model_dtype

    def autocast(self):
        if self.mixed and self.strategy != "fsdp":
            return torch.autocast(self.device_type, dtype=self.param_dtype)
        return contextlib.nullcontext()

    def fsdp_policy(self):
        """FSDP2's policy, or None where nothing is cast."""
        if not self.mixed and self.reduce_dtype == self.model_dtype:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.param_dtype, reduce_dtype=self.reduce_dtype)


def resolve(fsdp_config, device_type: str, strategy: str, role: str) -> Precision:
    """verl's defaults for an unset key (its generated config: model_dtype fp32 for the actor, reference and critic,
    mixed_precision.param_dtype bf16): weights fp32, compute bf16 on GPU; everything fp32 on CPU."""
    gpu = device_type == "cuda"
    model = DTYPES[fsdp_config.model_dtype or "fp32"]
    mp = fsdp_config.mixed_precision
    # a reference held in bf16 on the CPU, where nothing else asks for a compute dtype, computes in it
    cpu_compute = model if role == "ref" else torch.float32
    param = DTYPES[mp.param_dtype] if mp.param_dtype else (torch.bfloat16 if gpu else cpu_compute)
    return Precision(model, DTYPES[mp.buffer_dtype], param, DTYPES[mp.reduce_dtype], device_type, strategy)


def cast_buffers(module: torch.nn.Module, prec: Precision) -> None:
    """Floating-point buffers in buffer_dtype: a bf16 model keeps its rotary frequencies in fp32 (verl)."""
    for b in module.buffers():
        if b.is_floating_point():
            b.data = b.data.to(prec.buffer_dtype)


def allow_tf32() -> None:
    """What stays fp32 on an NVIDIA GPU (the log-softmax over the vocabulary, optimizer math) may use
    TF32 tensor cores, as verl allows."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


@contextlib.contextmanager
def tf32_kept():
    """TF32 as the process had it before the block, whatever the block sets: an engine built in the training process
    sets it for its own use (vLLM's GPU worker calls torch.set_float32_matmul_precision with
    VLLM_FLOAT32_MATMUL_PRECISION, "highest" by default, in 0.16 through 0.32 v1/worker/gpu_worker.py), which would
    take from training the TF32 that allow_tf32 gave it."""
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(matmul)
        torch.backends.cudnn.allow_tf32 = cudnn
