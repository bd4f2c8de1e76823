"""Rollout on a pool of its own, synchronous against one step off-policy: the same samples (the embedded run's
prompts, steps and batch) on two namespace nodes of one CPU each, the rollout engine on one and the training worker
on the other (actor_rollout_ref.hybrid_engine=False, rollout.nnodes=1, trainer.nnodes=1), run as users run it
(`rlrig train` on both nodes, dstack's variables).

Per mode: tokens per second (prompt and response tokens of every step over the steps' seconds, the first step, which
waits for nothing to overlap with, left out) and the score's rise over the same samples (the mean score of the last
quarter of the steps less that of the first quarter). Its last line:

  one-step/sync 1.52x tokens/s; score rise one-step/sync 0.97

Needs root (namespaces). On 2 cores the two nodes are the two cores.

    python bench/async.py                 # 60 steps a mode (about 6 minutes here)
    python bench/async.py --steps 20      # quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys

from bringup import BIN, Run, node_env, wait  # the bring-up bench's namespaces and node processes

from rlrig.trainer.config.presets import EMBEDDED

WEIGHTS = "timing_s/sync_rollout_weights"
MODES = {"sync": "sync", "one-step": "one_step_off_policy"}
POOL = [
    "actor_rollout_ref.hybrid_engine=False",
    "rollout.nnodes=1",
    "rollout.n_gpus_per_node=1",
    "trainer.nnodes=1",
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.name=hf",  # what the default run resolves to without vLLM; the same in both modes
    "trainer.val_before_train=False",
    "trainer.test_freq=0",
    "trainer.save_freq=0",
]


def train(mode: str, steps: int) -> list[dict]:
    run = Run(2, "rlrig")
    out = run.tmp / "out"
    args = [str(BIN / "rlrig"), "train", "--no-fabric-check", *EMBEDDED, *POOL]
    args += [f"trainer.async_mode={mode}", f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out}"]
    with run.ns:
        try:
            for i in range(2):
                (run.tmp / f"n{i}").mkdir()
            head = run.start(0, args, node_env(run.ns, 0, 2))
            run.start(1, args, node_env(run.ns, 1, 2))
            wait(lambda: head.proc.poll() is not None, 1800, f"the {mode} run", [head])
            if head.proc.returncode != 0:
                raise RuntimeError(f"the {mode} run exited {head.proc.returncode}:\n" + "\n".join(head.lines[-30:]))
            return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        finally:
            for proc in run.nodes:
                proc.kill()
            shutil.rmtree(run.tmp, ignore_errors=True)


def summary(rows: list[dict]) -> dict[str, float]:
    steady = rows[1:]
    q = max(1, len(rows) // 4)
    score = [r["critic/score/mean"] for r in rows]
    return {
        "tokens/s": sum(r["perf/total_num_tokens"] for r in steady) / sum(r["timing_s/step"] for r in steady),
        "step s": statistics.median(r["timing_s/step"] for r in steady),
        "gen wait s": statistics.median(r["timing_s/gen"] for r in steady),
        # one step off-policy pushes no weights after its last batch: there is no next one
        "weight sync s": statistics.median(r["timing_s/sync_rollout_weights"] for r in steady if WEIGHTS in r),
        "score rise": statistics.mean(score[-q:]) - statistics.mean(score[:q]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args(argv)
    got = {}
    for name, mode in MODES.items():
        got[name] = summary(train(mode, args.steps))
        print(f"{name}: " + ", ".join(f"{k} {v:.3f}" for k, v in got[name].items()), flush=True)
    speed = got["one-step"]["tokens/s"] / got["sync"]["tokens/s"]
    rise = got["one-step"]["score rise"] / got["sync"]["score rise"] if got["sync"]["score rise"] else float("nan")
    print(f"one-step/sync {speed:.2f}x tokens/s; score rise one-step/sync {rise:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
