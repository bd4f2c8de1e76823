"""On a machine with an NVIDIA GPU: the trainer's CUDA path (NCCL process group, DDP and FSDP2 on the
device, padding-free forwards, transformers rollout) and the GPU preflight against the real NVML.

CI has no GPU, so there these skip. They ran on a lent H100 (README, "What was run here and what was not"):

    python -m pytest -q tests/gpu
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def run_worker(overrides: list[str], steps: int | None = None, device: str = "cuda") -> list[dict]:
    """A one-rank job without Ray: the Worker the Ray actors run, on cuda:0 with NCCL (or on the CPU
    with Gloo, to try this helper where there is no GPU)."""
    from transformers import AutoTokenizer

    from rlrig.trainer.config import parse_overrides
    from rlrig.trainer.main import Sampler, load_rows
    from rlrig.trainer.presets import EMBEDDED
    from rlrig.trainer.tiny_model import ensure_tiny_model
    from rlrig.trainer.worker import Worker, free_port

    cfg = parse_overrides([*EMBEDDED, f"trainer.device={device}", "trainer.n_gpus_per_node=1",
                           "actor_rollout_ref.rollout.name=hf", *overrides])
    path = ensure_tiny_model()
    rows, _ = load_rows(cfg, AutoTokenizer.from_pretrained(path))
    sampler = Sampler(len(rows), cfg.data.train_batch_size, cfg.data.seed, cfg.data.shuffle)
    w = Worker(cfg.to_dict(), 0, 1, ("127.0.0.1", free_port()), path)
    try:
        assert w.device.type == device and next(w.module.parameters()).device.type == device
        assert torch.distributed.get_backend() == ("nccl" if device == "cuda" else "gloo")
        steps = steps or cfg.trainer.total_training_steps
        return [w.step([rows[i] for i in sampler.next()], cfg.algorithm.kl_ctrl.kl_coef) for _ in range(steps)]
    finally:
        w.shutdown()


def test_fsdp_and_packed_forwards_match_ddp_on_cuda():
    keys = ("critic/score/mean", "actor/pg_loss", "actor/kl_loss", "response_length/mean")
    runs = {name: run_worker(extra, steps=2) for name, extra in {
        "ddp": ["actor_rollout_ref.actor.strategy=ddp"],
        "fsdp": ["actor_rollout_ref.actor.strategy=fsdp"],
        "packed": ["actor_rollout_ref.actor.strategy=ddp", "actor_rollout_ref.model.use_remove_padding=True"],
    }.items()}
    for other in ("fsdp", "packed"):
        for a, b in zip(runs["ddp"], runs[other]):
            # GPU kernels differ by reduction order (sdpa picks kernels by mask), hence looser than on CPU
            assert [a[k] for k in keys] == pytest.approx([b[k] for k in keys], rel=1e-3, abs=1e-4), other


def test_embedded_default_learns_on_cuda():
    """The embedded default's own criterion (mean score of the last 10% of its steps >= the first 10%
    + 0.15), its 200 steps on one GPU."""
    rows = run_worker(["actor_rollout_ref.model.use_remove_padding=True"])
    scores = [r["critic/score/mean"] for r in rows]
    tenth = len(scores) // 10
    first, last = sum(scores[:tenth]) / tenth, sum(scores[-tenth:]) / tenth
    print(f"embedded on cuda: score {first:.3f} -> {last:.3f}")
    assert last >= first + 0.15, scores


def doctor(env_updates: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLRIG_", "SLURM_", "CUDA_VISIBLE"))}
    env.update(env_updates)
    r = subprocess.run([sys.executable, "-m", "rlrig.entrypoint.cli", "doctor", "--json"], capture_output=True, text=True, env=env)
    return {"rc": r.returncode, **json.loads(r.stdout)}


def test_preflight_reads_real_gpus_through_nvml():
    from rlrig.entrypoint.inventory import probe_nvidia

    gpus, probe = probe_nvidia()
    assert probe == "NVML" and len(gpus) == torch.cuda.device_count() >= 1
    fine = doctor({})
    assert fine["rc"] == 0 and fine["num_gpus"] == len(gpus), fine
    by_uuid = doctor({"CUDA_VISIBLE_DEVICES": gpus[0].uuid})
    assert by_uuid["rc"] == 0 and by_uuid["num_gpus"] == 1, by_uuid
    for bad in ("0,0", str(len(gpus)), "GPU-00000000-0000-0000-0000-000000000000", "first"):
        r = doctor({"CUDA_VISIBLE_DEVICES": bad})
        failed = [c for c in r["checks"] if c["status"] == "fail"]
        assert r["rc"] != 0 and failed and failed[0]["name"] == "CUDA_VISIBLE_DEVICES", (bad, r)
