"""One PPO step on one GPU, phase by phase: seconds and tokens/s of each phase, peak GPU memory, and the update's
model-FLOP utilisation, 6 x matmul parameters x tokens x epochs / seconds / the bf16 peak that this device shows on
an 8192^3 matrix product in the same run. Not a timed test: a device is lent only to some sessions.

Shapes (random weights, built offline): --shape 0.5b, Qwen2.5-0.5B's (494M parameters, tied 152k vocabulary);
--shape 7b, Qwen2.5-7B's width with --layers of its 28 decoder layers (default 8, so that the actor's fp32 weights
and Adam state and the reference fit one GPU) and gradient checkpointing; --shape 30b-a3b, Qwen3-30B-A3B's mixture
of experts (128 experts, 8 a token) with --layers of its 48 (default 4), and 30b-a3b-dense, the dense Qwen3 of the
same active parameters (its MLP as wide as 8 experts): `--shape 30b-a3b,30b-a3b-dense` runs both and prints the
MoE's update tokens/s and MFU against the dense model's (MFU counts the active parameters only). 32 prompts x 8
samples x 512 response tokens, GRPO with a KL loss against the reference, two mini batches (so the old log-prob pass
runs). --no-gen: random responses of the full length instead of hf generation (the update's cost is in its tokens,
not what they say). --token-budget N: verl's use_dynamic_bsz micro batches of at most N tokens (else --micro rows).
--strategies fsdp,ddp: the same step under each, and FSDP2's time over DDP's. --profile: one more step with its
update under torch.profiler, and the update's GPU time by bucket (bench/gpu_profile.py), under the first of
--strategies. Targets: update MFU >= 35%
at 0.5b and >= 40% at 7b in bf16; FSDP2 at most 1.15x DDP's step. bench/gpu_check.sh runs the whole GPU check.

    python bench/gpu_step.py [--shape 0.5b|7b|30b-a3b,30b-a3b-dense] [--precisions fp32,bf16]
        [--strategies fsdp,ddp] [--no-gen] [--token-budget 32768] [--profile] [--override KEY=VALUE ...] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace


def matmul_params(module) -> int:
    """Parameters that take part in a matrix product per token: all but an untied input embedding (a lookup) and,
    in a mixture of experts, the experts a token is not routed to (of E fused experts, k take each token)."""
    emb = module.get_input_embeddings().weight
    head = module.get_output_embeddings().weight
    total = sum(p.numel() for p in module.parameters()) - (emb.numel() if emb is not head else 0)
    cfg = module.config
    experts, k = getattr(cfg, "num_experts", 0) or 0, getattr(cfg, "num_experts_per_tok", 0) or 0
    if experts:
        fused = sum(p.numel() for name, p in module.named_parameters() if ".experts." in name)
        total -= fused * (experts - k) // experts
    return total


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


def profiled_step(w, req, vocab: int) -> dict:
    """One more step, its update under torch.profiler (the rest of the step unprofiled: hf generation's many small
    ops would take minutes to record): the update's GPU time by bucket."""
    import contextlib

    from gpu_profile import phase_buckets
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = w.device.type == "cuda"  # a CPU dry run profiles no kernels: all of it reads as idle
    plain, held = w.profiler.phase, {}

    @contextlib.contextmanager
    def phase(name):
        if name != "update_actor":
            with plain(name):
                yield
            return
        acts = [ProfilerActivity.CPU, *[ProfilerActivity.CUDA] * cuda]
        with profile(activities=acts, record_shapes=True) as prof:
            with record_function("phase/update_actor"):
                yield
        held["prof"] = prof

    w.profiler.phase = phase
    try:
        w.step(req)
    finally:
        w.profiler.phase = plain
    prof = held["prof"]
    if cuda:  # the kernels behind the buckets
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=70))
    return phase_buckets(prof, "phase/update_actor", vocab)


def fixed_samples(w, args):
    """--no-gen: the worker takes samples that come with each request, as from a rollout pool, instead of generating:
    random response tokens of the full length (the update's cost depends on the tokens, not on what they say)."""
    import dataclasses

    import torch

    from rlrig.trainer.rollout.engines.base import Rollout
    from rlrig.trainer.workers.step.phases import PooledSamples

    src = w.context.sources
    w.context = dataclasses.replace(w.context, sources=dataclasses.replace(src, rollout=PooledSamples(w.reward)))
    rows, prompt, vocab = args.prompts * args.n, 64, w.models.actor.module.config.vocab_size
    g = torch.Generator().manual_seed(0)

    def samples() -> Rollout:
        ids = torch.randint(3, vocab, (rows, prompt + args.new_tokens), generator=g)
        ones = torch.ones_like(ids)
        return Rollout(ids, ones, ones[:, prompt:].clone(), prompt)

    return samples


def run(precision: str, strategy: str, path: str, args) -> dict:
    import torch

    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.workers.step.request import StepRequest

    dtype = "fp32" if precision == "fp32" else "bf16"
    # verl's token-budget micro batches (use_dynamic_bsz), as its performance guide tunes a GPU run; 0: by count
    budget = (
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={args.token_budget}",
            f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={2 * args.token_budget}",
            f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={2 * args.token_budget}",
        ]
        if args.token_budget
        else []
    )
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
        f"actor_rollout_ref.actor.strategy={strategy}",
        f"actor_rollout_ref.ref.strategy={strategy}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={args.checkpointing}",
        *budget,
        *args.override,
    ]
    with single_worker([*overrides, f"trainer.device={args.device}"], path) as (w, batches):
        if precision == "fp32":  # the plain fp32 baseline: the worker allows TF32 for what stays fp32
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        params = matmul_params(w.models.actor.module)
        rows, buckets = [], None
        draw = fixed_samples(w, args) if args.no_gen else None

        def request(s: int, prompts_from=batches):
            prompts = next(prompts_from)
            if draw is None:
                return StepRequest(prompts, global_step=s + 1, kl_coef=0.001)
            each = [r for r in prompts for _ in range(args.n)]
            return StepRequest(each, global_step=s + 1, kl_coef=0.001, samples=draw())

        for s in range(args.steps):
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            m = w.step(request(s))
            m["step_s"] = time.perf_counter() - t0
            rows.append(m)
        if args.profile and strategy == args.strategies.split(",")[0]:
            buckets = profiled_step(w, request(args.steps), w.models.actor.module.config.vocab_size)
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
        "strategy": strategy,
        "buckets": buckets,
        "params": params,
        "tokens": tokens,
        "response_tokens": resp,
        "epochs": epochs,
        "metrics": m,
    }


SHAPES = {"0.5b": "QWEN2_0_5B", "7b": "QWEN2_5_7B", "30b-a3b": "QWEN3_30B_A3B", "30b-a3b-dense": "QWEN3_30B_A3B_DENSE"}
LAYERS = {"7b": 8, "30b-a3b": 4, "30b-a3b-dense": 4}  # default --layers: the actor's fp32 Adam state fits one GPU


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--strategies", default="fsdp", help="fsdp,ddp: the same step under each (FSDP2 against DDP)")
    p.add_argument("--shape", default="0.5b", help=f"comma-separated, of {', '.join(SHAPES)}")
    p.add_argument("--layers", type=int, default=None, help="decoder layers of 7b / 30b-a3b (default 8 / 4)")
    p.add_argument("--checkpointing", default=None, help="gradient checkpointing (default: on but at 0.5b)")
    p.add_argument("--profile", action="store_true", help="the last step under torch.profiler: the update's buckets")
    p.add_argument("--no-gen", action="store_true", help="random responses of the full length instead of generating")
    p.add_argument("--override", action="append", default=[], help="a further verl override (repeatable)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--micro", type=int, default=16, help="micro batch rows where --token-budget is 0")
    p.add_argument("--token-budget", type=int, default=0, help="ppo_max_token_len_per_gpu (use_dynamic_bsz); 0: off")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--remove-padding", default="True")
    p.add_argument("--json")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script with a tiny shape (--tiny)")
    p.add_argument("--tiny", action="store_true", help="2 layers of 64: checks the script, measures nothing")
    args = p.parse_args()
    unknown = [s for s in args.shape.split(",") if s not in SHAPES]
    if unknown:
        p.error(f"--shape {unknown[0]}: choose from {', '.join(SHAPES)}")
    return args


def shape_of(name: str, args):
    from rlrig.trainer.embedded import synthetic

    shape = getattr(synthetic, SHAPES[name])
    if name in LAYERS:
        shape = replace(shape, num_hidden_layers=args.layers or LAYERS[name])
    if args.tiny:  # the same kind of model, 2 layers of 64 (4 experts, 2 a token)
        small = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)
        small |= dict(num_key_value_heads=2, max_position_embeddings=1024)
        if shape.num_experts:
            small |= dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
        shape = replace(shape, **small, head_dim=32 if shape.head_dim else None)
    return shape


def report(r: dict, peak: float) -> None:
    m = r["metrics"]
    upd = m["timing_s/update_actor"]
    r["update_mfu"] = 6 * r["params"] * r["tokens"] * r["epochs"] / upd / (peak * 1e12)
    r["update_tokens_s"] = r["tokens"] * r["epochs"] / upd
    print(
        f"\n== {r['shape']} {r['precision']} {r['strategy']}: {r['params'] / 1e6:.0f}M matmul parameters (active); "
        f"{r['tokens']:.0f} tokens, {r['response_tokens']:.0f} in responses; "
        f"step {m['step_s']:.1f} s; peak GPU memory {m.get('perf/max_memory_allocated_gb', 0):.1f} GB"
    )
    print(f"{'phase':16} {'seconds':>8} {'tokens/s':>10}")
    for k in ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights"):
        s = m.get(f"timing_s/{k}", 0.0)
        count = r["response_tokens"] if k == "gen" else r["tokens"]
        print(f"{k:16} {s:8.2f} {count / s if s > 0.001 else float('nan'):10.0f}")
    print(
        f"update MFU {100 * r['update_mfu']:.1f}% of the measured bf16 peak (6 x params x tokens x epochs / update s)"
    )
    if r["buckets"]:
        from gpu_profile import table

        print(f"\nthe update's GPU time by bucket (torch.profiler, one more step):\n{table(r['buckets'])}")


def comparisons(results: list[dict]) -> None:
    bf16 = [r for r in results if r["precision"] == "bf16"]
    for shape in dict.fromkeys(r["shape"] for r in results):
        by_strategy = {r["strategy"]: r["metrics"] for r in bf16 if r["shape"] == shape}
        if {"fsdp", "ddp"} <= by_strategy.keys():
            f, d = by_strategy["fsdp"], by_strategy["ddp"]
            print(
                f"\n{shape} FSDP2 / DDP (bf16): step {f['step_s'] / d['step_s']:.2f}x, "
                f"update {f['timing_s/update_actor'] / d['timing_s/update_actor']:.2f}x (target <= 1.15x)"
            )
        first = [r for r in results if r["shape"] == shape and r["strategy"] == results[0]["strategy"]]
        by = {r["precision"]: r["metrics"] for r in first}
        if {"fp32", "bf16"} <= by.keys():
            a, b = by["fp32"], by["bf16"]
            print(
                f"\n{shape} bf16 vs fp32: step {a['step_s'] / b['step_s']:.2f}x faster, "
                f"update {a['timing_s/update_actor'] / b['timing_s/update_actor']:.2f}x, "
                f"generation {a['timing_s/gen'] / b['timing_s/gen']:.2f}x; peak memory "
                f"{b.get('perf/max_memory_allocated_gb', 0) / a.get('perf/max_memory_allocated_gb', 1):.2f}x"
            )
        goal = {"0.5b": 0.35, "7b": 0.40}.get(shape)
        mine = [r for r in bf16 if r["shape"] == shape]
        if goal and mine:
            met = "met" if mine[0]["update_mfu"] >= goal else "NOT met"
            print(f"target update MFU >= {goal:.0%} (bf16, {shape}): {met}")
    moe = next((r for r in bf16 if r["shape"] == "30b-a3b"), None)
    dense = next((r for r in bf16 if r["shape"] == "30b-a3b-dense" and moe and r["strategy"] == moe["strategy"]), None)
    if moe and dense:
        print(
            f"\nMoE / dense of the same active parameters (bf16, {moe['strategy']}): update tokens/s "
            f"{moe['update_tokens_s'] / dense['update_tokens_s']:.2f}x, MFU {100 * moe['update_mfu']:.1f}% vs "
            f"{100 * dense['update_mfu']:.1f}%"
        )


def main() -> None:
    args = parse_args()
    import torch

    from rlrig.trainer.embedded.synthetic import ensure_model

    if args.device == "cuda":
        peak = matmul_peak_tflops()
        print(f"device: {torch.cuda.get_device_name()}; bf16 8192^3 matrix product: {peak:.0f} TFLOP/s")
    else:
        peak = 1.0
    checkpointing = args.checkpointing
    results = []
    for name in args.shape.split(","):
        shape = shape_of(name, args)
        args.checkpointing = checkpointing if checkpointing is not None else str(name != "0.5b")
        t0 = time.perf_counter()
        path = ensure_model(shape, dtype="bfloat16" if name != "0.5b" and not args.tiny else None)
        print(f"model {name}: {shape} ({time.perf_counter() - t0:.0f} s to build or find)")
        for prec, strategy in [(p, s) for p in args.precisions.split(",") for s in args.strategies.split(",")]:
            r = run(prec, strategy, path, args)
            r["shape"] = name
            report(r, peak)
            results.append(r)
            if args.json:  # after each run: a part stopped by its time limit keeps the runs it finished
                with open(args.json, "w") as f:
                    json.dump({"peak_tflops": peak, "results": results}, f, indent=1)
    comparisons(results)


if __name__ == "__main__":
    main()
