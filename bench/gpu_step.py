"""One PPO step of a Qwen2-0.5B-shaped model on one GPU, fp32 against bf16 mixed precision, phase by phase.

The model has Qwen2.5-0.5B's shape (494M parameters, 152k vocabulary) with random weights, built
offline; 32 prompts x 8 samples x 512 new tokens (a random model rarely stops early), GRPO with a KL
loss against the reference, two mini batches (so the old log-prob pass runs), hf rollout. For each
precision the worker runs --steps steps and the last is reported: seconds and tokens/s of each phase,
peak GPU memory, and the update's model-FLOP utilisation, 6 x parameters x tokens x epochs / seconds /
the bf16 peak that this device shows on an 8192^3 matrix product in the same run. Target: MFU >= 35%
in bf16. Not a timed test: a device is lent only to some sessions.

    python bench/gpu_step.py [--precisions fp32,bf16] [--new-tokens 512] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import time


def matmul_peak_tflops(n: int = 8192, reps: int = 10) -> float:
    import torch

    a, b = (
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
        torch.randn(n, n, device="cuda", dtype=torch.bfloat16),
    )
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def run(precision: str, path: str, args) -> dict:
    import torch

    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.workers.step.request import StepRequest

    dtype = "fp32" if precision == "fp32" else "bf16"
    overrides = [
        f"actor_rollout_ref.model.path={path}",
        "trainer.device=cuda",
        "actor_rollout_ref.rollout.name=hf",
        "algorithm.adv_estimator=grpo",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // 2}",
        "data.max_prompt_length=64",
        f"data.max_response_length={args.new_tokens}",
        "actor_rollout_ref.actor.use_kl_loss=True",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={args.micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={args.micro * 2}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={args.micro * 2}",
        f"actor_rollout_ref.model.use_remove_padding={args.remove_padding}",
        f"actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype={dtype}",
        f"actor_rollout_ref.ref.fsdp_config.model_dtype={dtype}",
        "data.shuffle=False",
    ]
    with single_worker([*overrides, f"trainer.device={args.device}"], path) as (w, batches):
        if precision == "fp32":  # the plain fp32 baseline: the worker allows TF32 for what stays fp32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        params = sum(p.numel() for p in w.models.actor.module.parameters())
        rows = []
        for s in range(args.steps):
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            m = w.step(StepRequest(next(batches), global_step=s + 1, kl_coef=0.001))
            m["step_s"] = time.perf_counter() - t0
            rows.append(m)
        epochs = w.cfg.actor_rollout_ref.actor.ppo_epochs
    del w, batches  # the worker's modules sit in reference cycles (DDP, FSDP): collected before the next run
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    m = rows[-1]
    tokens = m["perf/total_num_tokens"]
    resp = m["_response_tokens"]
    return {
        "precision": precision,
        "params": params,
        "tokens": tokens,
        "response_tokens": resp,
        "epochs": epochs,
        "metrics": m,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--remove-padding", default="True")
    p.add_argument("--json")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script with a tiny shape (--tiny)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model: checks the script, measures nothing")
    args = p.parse_args()

    import torch

    from rlrig.trainer.embedded.synthetic import QWEN2_0_5B, Shape, ensure_model

    path = ensure_model(Shape(151936, 64, 128, 2, 2, 2, 1024) if args.tiny else QWEN2_0_5B)
    if args.device == "cuda":
        peak = matmul_peak_tflops()
        print(f"device: {torch.cuda.get_device_name()}; bf16 8192^3 matrix product: {peak:.0f} TFLOP/s")
    else:
        peak = 1.0
    results = []
    for prec in args.precisions.split(","):
        r = run(prec, path, args)
        m = r["metrics"]
        upd = m["timing_s/update_actor"]
        r["update_mfu"] = 6 * r["params"] * r["tokens"] * r["epochs"] / upd / (peak * 1e12)
        results.append(r)
        print(
            f"\n== {prec}: {r['params'] / 1e6:.0f}M parameters; {r['tokens']:.0f} tokens, "
            f"{r['response_tokens']:.0f} generated; "
            f"step {m['step_s']:.1f} s; peak GPU memory {m.get('perf/max_memory_allocated_gb', 0):.1f} GB"
        )
        print(f"{'phase':16} {'seconds':>8} {'tokens/s':>10}")
        for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
            s = m.get(f"timing_s/{k}", 0.0)
            count = r["response_tokens"] if k == "gen" else r["tokens"]
            print(f"{k:16} {s:8.2f} {count / s if s > 0.001 else float('nan'):10.0f}")
        print(
            f"update MFU {100 * r['update_mfu']:.1f}% of the measured bf16 peak "
            "(6 x params x tokens x epochs / update seconds)"
        )
    by = {r["precision"]: r["metrics"] for r in results}
    if {"fp32", "bf16"} <= by.keys():
        a, b = by["fp32"], by["bf16"]
        print(
            f"\nbf16 vs fp32: step {a['step_s'] / b['step_s']:.2f}x faster, "
            f"update {a['timing_s/update_actor'] / b['timing_s/update_actor']:.2f}x, "
            f"generation {a['timing_s/gen'] / b['timing_s/gen']:.2f}x; peak memory "
            f"{b.get('perf/max_memory_allocated_gb', 0) / a.get('perf/max_memory_allocated_gb', 1):.2f}x"
        )
    target = [r for r in results if r["precision"] == "bf16"]
    if target:
        print(f"target update MFU >= 35% (bf16): {'met' if target[0]['update_mfu'] >= 0.35 else 'NOT met'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peak_tflops": peak, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
