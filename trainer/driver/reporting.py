"""What the driver tells the user: one-line messages, the progress bar, and each step's metrics in
metrics.jsonl (plus TensorBoard and Weights & Biases, as trainer.logger asks)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def say(msg: str) -> None:
    print(f"rlrig.train: {msg}", file=sys.stderr, flush=True)


class MetricsLog:
    def __init__(self, cfg, path: Path):
        self.path, self.loggers = path, cfg.trainer.logger
        self.tb = self.wandb = None
        if "tensorboard" in self.loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(path.parent / "tensorboard"))
        if "wandb" in self.loggers:
            if cfg.trainer.wandb_proxy:  # applies to wandb only, never to Ray or the data loaders
                os.environ["WANDB_HTTP_PROXY"] = os.environ["WANDB_HTTPS_PROXY"] = cfg.trainer.wandb_proxy
            import wandb

            self.wandb = wandb.init(
                project=cfg.trainer.project_name, name=cfg.trainer.experiment_name, config=cfg.to_dict()
            )

    def log(self, step: int, metrics: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(metrics, step=step)


def progress(step: int, total: int, m: dict, started: float, first_step: int) -> None:
    done = step - first_step + 1
    per = (time.monotonic() - started) / done
    eta = per * (total - step)
    width = 24
    fill = int(width * step / total)
    print(
        f"\r[{'#' * fill}{'.' * (width - fill)}] step {step}/{total} score {m['critic/score/mean']:.3f} "
        f"{m['timing_s/step']:.2f}s/step ETA {int(eta // 60)}m{int(eta % 60):02d}s",
        end="" if sys.stderr.isatty() else "\n",
        file=sys.stderr,
        flush=True,
    )


def rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1024**3
