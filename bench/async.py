"""Rollout on a pool of its own, synchronous against one step off-policy and fully async: the same samples (the
embedded run's prompts, 200 steps and batch) on two namespace nodes of one CPU each, the rollout engine on one and the
training worker on the other (actor_rollout_ref.hybrid_engine=False, rollout.nnodes=1, trainer.nnodes=1), run as users
run it (`rlrig train` on both nodes, dstack's variables).

Fully async takes the same updates: require_batches=2 mini batches of 16 prompts (the embedded batch of 32, one
update each), a weight sync after each (trigger_parameter_sync_step=1), staleness_threshold=1 (the engines may run
a version ahead, as one step off-policy does) and partial rollouts (verl's default), as many prompts in all
(rollout.total_rollout_steps = steps x 32).

Per mode: tokens per second (prompt and response tokens of every step over the steps' seconds, the first step, which
waits for nothing to overlap with, left out) and the score's rise over the same samples (the mean score of the last
quarter of the steps less that of the first step's batch, which every mode draws with the untrained weights). Its
last line:

  one-step/sync 1.52x, fully-async/sync 1.61x tokens/s; score rise one-step/sync 0.97, fully-async/sync 0.94

Needs root (namespaces). On 2 cores the two nodes are the two cores.

    python bench/async.py                 # the embedded run's 200 steps a mode
    python bench/async.py --steps 20      # quick look
    python bench/async.py --seeds 2       # another draw: the rises are seeded
    python bench/async.py --seeds 1 2 3   # three draws a mode, compared by their means

Over 60 steps a run's rise is still mostly its own draw: the same mode's rise ranged 0.07-0.15 over six seeds.
Over the embedded run's 200 steps the score has most of its way behind it, and what is compared is how far the
same samples took each mode (about 20 minutes for three seeds here).
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
BATCH = 32  # the embedded run's data.train_batch_size
MODES = {
    "sync": lambda steps: ["trainer.async_mode=sync"],
    "one-step": lambda steps: ["trainer.async_mode=one_step_off_policy"],
    "fully-async": lambda steps: [
        "data.train_batch_size=0",
        "async_training.require_batches=2",
        "async_training.trigger_parameter_sync_step=1",
        "async_training.staleness_threshold=1.0",
        "async_training.partial_rollout=True",
        f"rollout.total_rollout_steps={steps * BATCH}",
        "rollout.test_freq=0",
    ],
}
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


def train(mode: str, steps: int, seed: int | None = None) -> list[dict]:
    run = Run(2, "rlrig")
    out = run.tmp / "out"
    args = [str(BIN / "rlrig"), "train", "--no-fabric-check", *EMBEDDED, *POOL, *MODES[mode](steps)]
    args += [f"trainer.total_training_steps={steps}", f"trainer.default_local_dir={out}"]
    if seed is not None:  # the data's order and the sampling both: another draw of the same comparison
        args += [f"trainer.seed={seed}", f"data.seed={seed}"]
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
        # from the first step's batch, which every mode draws with the same untrained weights: a mode that learns
        # sooner (on-policy) would otherwise be charged for its rise within the first quarter
        "score rise": statistics.mean(score[-q:]) - score[0],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=[None],
        help="trainer.seed and data.seed, each a run of every mode (default: the config's, 1); the last line then "
        "compares the modes' means over the seeds",
    )
    args = ap.parse_args(argv)
    runs: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for name in args.modes:
            runs.setdefault(name, []).append(summary(train(name, args.steps, seed)))
            shown = ", ".join(f"{k} {v:.3f}" for k, v in runs[name][-1].items())
            print(f"{name}{'' if seed is None else f' (seed {seed})'}: {shown}", flush=True)
    got = {name: {k: statistics.mean(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()}
    if len(args.seeds) > 1:
        for name, mean in got.items():
            print(f"{name}, mean of {len(args.seeds)} seeds: " + ", ".join(f"{k} {v:.3f}" for k, v in mean.items()))
    others = [m for m in got if m != "sync"]
    if "sync" not in got or not others:
        return 0
    base = got["sync"]
    speeds = ", ".join(f"{m}/sync {got[m]['tokens/s'] / base['tokens/s']:.2f}x" for m in others)
    rises = ", ".join(
        f"{m}/sync {got[m]['score rise'] / base['score rise']:.2f}" if base["score rise"] else f"{m}/sync nan"
        for m in others
    )
    print(f"{speeds} tokens/s; score rise {rises}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
