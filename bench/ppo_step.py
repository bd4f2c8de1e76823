"""PPO/GRPO step speed: rlrig against TRL's GRPOTrainer and against a plain loop (the floor), in one run.

Same work for all three: the embedded model and tokenizer, the offline arithmetic prompts, --batch
prompts x --n samples a step, --response-len new tokens at temperature 1, GRPO advantages, a
low-variance KL loss against a frozen reference (k3, coefficient 0.001), one optimizer step over the
whole batch (AdamW, the same lr), on the same CPU cores.
- rlrig: `rlrig train` as a user runs it (its own local Ray, two data-parallel workers of one thread), with
  verl's `actor_rollout_ref.actor.use_prefix_grouper=True`: the reference's and the update's forwards compute
  each prompt once for its n samples (TRL has no such option); and `trainer.balance_batch=False`: the forwards
  here are padded, so a worker's work is its batch's width, not its tokens, and trading samples between the
  workers would buy nothing for the barrier it adds (with it on, the step time outside the phases grows from
  a few milliseconds to about 10 on 2 CPU cores).
- TRL: GRPOTrainer with per_device_train_batch_size = batch x n, num_generations = n, one generation
  per optimizer step, beta 0.001, torch on all cores.
- floor: one process, no Ray and no torch.distributed, calling the same kernels rlrig's worker calls
  (transformers generate, the log-prob pass with shared prompts, core_algos) in a loop, torch on all cores.

Per method and run: --steps steps, the first --warmup dropped; seconds per step is the median of the
rest; runs are interleaved --repeats times and the table shows the median run;
tokens/s is verl's perf/throughput, (prompt + response tokens of the step) / seconds, here per
machine rather than per device since all three share the same cores. Then rlrig's and the floor's tokens/s
over TRL's in each round (rlrig calls the floor's kernels: with rlrig's step at the floor's, rlrig/TRL is about
floor/TRL) and, last, the two ratios.
Targets: rlrig at least 1.6x TRL's tokens/s and within 1.05x of the floor's seconds per step.

    python bench/ppo_step.py            # needs `pip install 'rlrig[bench]'` (TRL) for the TRL column
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LR, KL_COEF = 5e-4, 0.001


def prompt_rows(count: int, seed: int) -> list[dict]:
    from rlrig.trainer.data.datasets import arithmetic_rows

    return arithmetic_rows(count, "train", seed)


def run_rlrig(a) -> list[tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="rlrig-bench-") as d:
        args = [
            sys.executable,
            "-m",
            "rlrig.entrypoint.cli",
            "train",
            "algorithm.adv_estimator=grpo",
            f"data.train_batch_size={a.batch}",
            f"actor_rollout_ref.rollout.n={a.n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={a.batch}",
            f"data.max_response_length={a.response_len}",
            "actor_rollout_ref.rollout.name=hf",
            f"actor_rollout_ref.actor.optim.lr={LR}",
            "actor_rollout_ref.actor.use_kl_loss=True",
            "actor_rollout_ref.actor.use_prefix_grouper=True",
            "trainer.balance_batch=False",
            f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}",
            "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
            f"trainer.total_training_steps={a.steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            f"trainer.default_local_dir={d}/run",
        ]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"rlrig train failed:\n{r.stderr[-3000:]}")
        rows = [json.loads(line) for line in Path(d, "run/metrics.jsonl").read_text().splitlines()]
    return [
        (m["timing_s/step"], m["perf/total_num_tokens"], {k[9:]: v for k, v in m.items() if k.startswith("timing_s/")})
        for m in rows
    ]


def run_floor(a) -> list[tuple[float, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.algos import core_algos as algos
    from rlrig.trainer.algos.estimators.grpo import grpo_advantages
    from rlrig.trainer.algos.policy_losses.vanilla import clipped_surrogate
    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.data.datasets import tokenize_prompts
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs
    from rlrig.trainer.reward.rules import default_compute_score
    from rlrig.trainer.rollout.engines import EngineContext
    from rlrig.trainer.rollout.engines.hf_engine import HFRollout

    torch.manual_seed(0)
    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    opt = torch.optim.AdamW(policy.parameters(), lr=LR, weight_decay=0.01)
    engine = HFRollout(
        EngineContext(policy, tok, RolloutConfig(temperature=1.0, top_p=1.0), 16, a.response_len, path, "cpu", 0)
    )
    rows = tokenize_prompts(prompt_rows(a.batch * a.steps, seed=0), tok, 16, "error", True)
    out = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        batch = rows[step * a.batch : (step + 1) * a.batch]
        ro = engine.generate([r["input_ids"] for r in batch], a.n)
        t_gen = time.perf_counter()
        texts = tok.batch_decode(ro.input_ids[:, ro.prompt_len :], skip_special_tokens=True)
        scores = torch.tensor(
            [
                default_compute_score(
                    batch[i // a.n]["data_source"], t, batch[i // a.n]["reward_model"]["ground_truth"]
                )
                for i, t in enumerate(texts)
            ]
        )
        mask = ro.response_mask.float()
        t_reward = time.perf_counter()
        with torch.no_grad():
            ref_logp = token_logprobs(
                ref, ro.input_ids, ro.attention_mask, ro.prompt_len, ForwardOptions(share_prompts=True)
            )[0]
        t_ref = time.perf_counter()
        adv, _ = grpo_advantages(scores, mask, [i // a.n for i in range(len(scores))], True)
        t_adv = time.perf_counter()
        opt.zero_grad()
        logp, ent = token_logprobs(
            policy,
            ro.input_ids,
            ro.attention_mask,
            ro.prompt_len,
            ForwardOptions(with_entropy=True, entropy_grad=False, share_prompts=True),
        )
        # one optimizer step over the whole batch: on-policy, the old log-probs are these (as in rlrig and TRL)
        pg, _, _ = clipped_surrogate(logp.detach(), logp, adv, mask, 0.2, 0.2, 3.0, "token-mean")
        kl = algos.agg_loss(algos.kl_penalty(logp, ref_logp, "low_var_kl"), mask, "token-mean")
        (pg + KL_COEF * kl).backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        opt.step()
        t_end = time.perf_counter()
        phases = {
            "gen": t_gen - t0,
            "reward": t_reward - t_gen,
            "ref": t_ref - t_reward,
            "adv": t_adv - t_ref,
            "update_actor": t_end - t_adv,
        }
        out.append((t_end - t0, float(ro.attention_mask.sum()), phases))
    return out


def run_trl(a) -> list[tuple[float, float]]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.reward.rules import gsm8k_score

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    rows = prompt_rows(a.batch * a.steps, seed=0)
    # plain-text prompts: the embedded chat template is the bare content, so the model sees the same ids
    ds = Dataset.from_list(
        [{"prompt": r["prompt"][0]["content"], "answer": r["reward_model"]["ground_truth"]} for r in rows]
    )

    def reward(completions, answer, **_):
        return [gsm8k_score(c, x) for c, x in zip(completions, answer)]

    class Timer(TrainerCallback):
        def __init__(self):
            self.times: list[float] = []

        def on_step_begin(self, *_, **__):
            self.t0 = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.times.append(time.perf_counter() - self.t0)

    timer = Timer()
    with tempfile.TemporaryDirectory(prefix="rlrig-bench-trl-") as d:
        cfg = GRPOConfig(
            output_dir=d,
            per_device_train_batch_size=a.batch * a.n,
            num_generations=a.n,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            max_completion_length=a.response_len,
            temperature=1.0,
            top_p=1.0,
            beta=KL_COEF,
            learning_rate=LR,
            lr_scheduler_type="constant",
            max_grad_norm=1.0,
            weight_decay=0.01,
            max_steps=a.steps,
            logging_steps=1,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
            bf16=False,
            dataloader_num_workers=0,
            shuffle_dataset=False,
            seed=0,
        )
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        trainer = GRPOTrainer(
            model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok, callbacks=[timer]
        )
        trainer.train()
    seen = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
    tokens = [b - a_ for a_, b in zip([0.0, *seen], seen)]
    return [(t, n, {}) for t, n in zip(timer.times, tokens)]  # TRL's step is not split into phases


def child(method: str, a) -> list[tuple[float, float]]:
    """Each method runs in its own process: thread settings and memory do not leak between them."""
    cmd = [
        sys.executable,
        __file__,
        "--only",
        method,
        *(
            f"--{k.replace('_', '-')}={v}"
            for k, v in (("steps", a.steps), ("batch", a.batch), ("n", a.n), ("response_len", a.response_len))
        ),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    if r.returncode != 0:
        raise SystemExit(f"{method} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def summary(steps: list, warmup: int) -> tuple[float, float, dict]:
    """Median seconds a step, tokens/s, and each phase's median seconds, over the steps after the warm-up."""
    later = steps[warmup:]
    secs = statistics.median(s for s, _, _ in later)
    phases = {k: statistics.median(p[k] for _, _, p in later if k in p) for k in later[0][2]}
    return secs, statistics.median(t for _, t, _ in later) / secs, phases


# the phases both rlrig and the floor time; rlrig's step is each worker's phases (the slowest worker's) plus the
# driver's work between them (Ray calls, gathering metrics, logging): "other" is what the phases leave out
PHASES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor", "update_weights")


def phase_table(rlrig: dict, floor: dict, rlrig_step: float, floor_step: float) -> None:
    print(f"\n{'phase':>14} {'rlrig s':>8} {'floor s':>8} {'rlrig/floor':>11}")
    for k in PHASES:
        r, f = rlrig.get(k, 0.0), floor.get(k, 0.0)
        if r or f:
            print(f"{k:>14} {r:8.4f} {f:8.4f} {r / f if f else float('nan'):11.2f}")
    ro, fo = rlrig_step - sum(rlrig.get(k, 0.0) for k in PHASES), floor_step - sum(floor.get(k, 0.0) for k in PHASES)
    print(f"{'other':>14} {ro:8.4f} {fo:8.4f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="prompts a step")
    ap.add_argument("--n", type=int, default=8, help="samples a prompt")
    ap.add_argument("--response-len", type=int, default=8)
    ap.add_argument("--only", choices=["floor", "trl"], help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.only:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        print(json.dumps((run_floor if a.only == "floor" else run_trl)(a)))
        return 0
    try:
        import trl  # noqa: F401
    except ImportError:
        print("bench/ppo_step.py needs TRL for its comparison: pip install 'rlrig[bench]'", file=sys.stderr)
        return 2
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    ensure_tiny_model()
    runs: dict[str, list[tuple[float, float, dict]]] = {"rlrig": [], "TRL": [], "floor": []}
    for rep in range(a.repeats):  # interleaved, so a slow spell of the machine hits every method alike
        for name, fn in (
            ("rlrig", lambda: run_rlrig(a)),
            ("TRL", lambda: child("trl", a)),
            ("floor", lambda: child("floor", a)),
        ):
            runs[name].append(summary(fn(), a.warmup))
            print(
                f"  run {rep + 1} {name:>5}: {runs[name][-1][0]:.3f} s/step, {runs[name][-1][1]:.0f} tokens/s",
                file=sys.stderr,
                flush=True,
            )
    results = {
        name: (statistics.median(s for s, _, _ in r), statistics.median(t for _, t, _ in r)) for name, r in runs.items()
    }
    phases = {name: {k: statistics.median(p[k] for _, _, p in r) for k in r[0][2]} for name, r in runs.items()}
    print(
        f"\n{a.batch} prompts x {a.n} samples, {a.response_len} new tokens; per run the median of steps "
        f"{a.warmup + 1}..{a.steps}, then the median of {a.repeats} runs"
    )
    print(f"{'method':>6} {'s/step':>8} {'tokens/s':>9}")
    for name, (secs, tps) in results.items():
        print(f"{name:>6} {secs:8.3f} {tps:9.0f}")
    phase_table(phases["rlrig"], phases["floor"], results["rlrig"][0], results["floor"][0])
    # rlrig calls the floor's kernels: with its step at the floor's, rlrig/TRL is about floor/TRL
    for name in ("rlrig", "floor"):
        rounds = ", ".join(f"{f[1] / t[1]:.2f}x" for f, t in zip(runs[name], runs["TRL"]))
        print(f"{name}/TRL tokens/s per round: {rounds}")
    print(
        f"rlrig/TRL tokens/s {results['rlrig'][1] / results['TRL'][1]:.2f}x (target >= 1.6); "
        f"rlrig/floor s/step {results['rlrig'][0] / results['floor'][0]:.2f}x (target <= 1.05)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
