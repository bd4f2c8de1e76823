"""Validation on the head: the validation prompts spread over the training workers, each generating with
rollout.val_kwargs and scoring, and verl's val-core/val-aux metrics over the results (driver/val_metrics.py)."""

from __future__ import annotations

import json
from pathlib import Path

from .reporting import say
from .val_metrics import validation_metrics


def spread(rows: list, parts: int) -> list[list]:
    """Every row, in order, over `parts` lists as evenly as possible (validation keeps every prompt)."""
    size, extra = divmod(len(rows), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(parts)]


def val_parts(rows: list, workers: int) -> tuple[list[list], list[bool]]:
    """Each worker's validation prompts, and which are fillers: a worker left without any gets the first prompt
    again, its result dropped, since an engine spanning workers (tensor parallel) generates or scores only when all
    of its workers ask, and a worker left out would leave the others waiting."""
    parts = spread(rows, workers)
    return [p or rows[:1] for p in parts], [not p for p in parts]


def validate_rows(workers, val_rows, cfg, step: int = 0, out: Path | None = None) -> dict:
    """Validation with rollout.val_kwargs (n samples a prompt), data.val_batch_size prompts at a time (None: all
    at once) spread over the workers: verl's val-core/val-aux metrics (driver/val_metrics.py).
    trainer.log_val_generations samples are printed and appended to val_generations.jsonl."""
    import ray

    if not val_rows:
        return {}
    n = cfg.actor_rollout_ref.rollout.val_kwargs.n
    prompts: list[tuple[str, list[dict]]] = []  # (data source, each sample's variables)
    shown, turns = [], []
    step_size = cfg.data.val_batch_size or len(val_rows)
    for start in range(0, len(val_rows), step_size):
        parts, fillers = val_parts(val_rows[start : start + step_size], len(workers))
        results = [
            res
            for res, filler in zip(ray.get([w.evaluate.remote(p) for w, p in zip(workers, parts)]), fillers)
            if not filler
        ]
        rows = [r for p, filler in zip(parts, fillers) if not filler for r in p]
        scores = [s for res in results for s in res[0]]
        texts = [t for res in results for t in res[1]]
        extras = [e for res in results for e in res[2]]
        turns += [k for res in results for k in res[3]]
        for i, r in enumerate(rows):
            prompts.append((r["data_source"], [{"reward": scores[j], **extras[j]} for j in range(i * n, (i + 1) * n)]))
            if len(shown) < cfg.trainer.log_val_generations:
                shown.append(
                    {
                        "step": step,
                        "data_source": r["data_source"],
                        "prompt": r[cfg.data.prompt_key],
                        "response": texts[i * n],
                        "score": scores[i * n],
                    }
                )
    m = validation_metrics(prompts)
    # verl's, over every sample: the prompt and each assistant and user turn (2 for a single-turn sample)
    m.update({"val-aux/num_turns/min": min(turns), "val-aux/num_turns/max": max(turns)})
    m["val-aux/num_turns/mean"] = sum(turns) / len(turns)
    if shown:
        for g in shown:
            say(f"validation sample (step {step}, score {g['score']}): {g['response']!r}")
        if out is not None:
            with open(out / "val_generations.jsonl", "a") as f:
                f.writelines(json.dumps(g, default=str) + "\n" for g in shown)
        if "mlflow" in cfg.trainer.logger:
            mlflow_generations(shown, step)
    return m


def mlflow_generations(shown: list[dict], step: int) -> None:
    """The shown samples as an artifact of the MLflow run, verl's val_step<step>.json."""
    import tempfile

    import mlflow

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"val_step{step}.json"
        rows = [{"input": g["prompt"], "output": g["response"], "score": g["score"]} for g in shown]
        path.write_text(json.dumps(rows, default=str))
        mlflow.log_artifact(str(path))
