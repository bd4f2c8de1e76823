"""What the driver tells the user: one-line messages, the progress bar, and each step's metrics in
metrics.jsonl (plus TensorBoard, Weights & Biases, MLflow and verl's file logger, as trainer.logger asks)."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from pathlib import Path

from .. import mlflow_store


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

        self.mlflow = mlflow_run(cfg) if "mlflow" in self.loggers else None
        self.file = file_log(cfg) if "file" in self.loggers else None

    def log(self, step: int, metrics: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self.tb:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb:
            self.wandb.log(metrics, step=step)
        if self.mlflow:
            self.mlflow.log_metrics({mlflow_key(k): v for k, v in metrics.items()}, step=step)
        if self.file:
            self.file.write(json.dumps({"step": step, "data": metrics}).encode() + b"\n")


def file_log(cfg):
    """verl's file logger: a JSON line {"step", "data"} a step, in VERL_FILE_LOGGER_PATH, else
    VERL_FILE_LOGGER_ROOT (default: the working directory)/<project_name>/<experiment_name>.jsonl, written anew
    as verl writes it, unbuffered."""
    path = os.environ.get("VERL_FILE_LOGGER_PATH")
    if path is None:
        root = Path(os.path.expanduser(os.environ.get("VERL_FILE_LOGGER_ROOT", "."))) / cfg.trainer.project_name
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{cfg.trainer.experiment_name}.jsonl"
    say(f"file logger: {Path(path).resolve()}")
    return open(path, "wb", buffering=0)  # noqa: SIM115 - open for the whole run, as verl's


def mlflow_run(cfg):
    """verl's MLflow logger: the run MLFLOW_RUN_ID names (a platform's), else a new one named
    trainer.experiment_name in the project's experiment, with the config as its parameters."""
    import mlflow

    project_id = mlflow_store.experiment_id(cfg.trainer.project_name)
    if os.environ.get("MLFLOW_RUN_ID"):
        mlflow.start_run(run_id=os.environ["MLFLOW_RUN_ID"])
    else:
        mlflow.start_run(experiment_id=project_id, run_name=cfg.trainer.experiment_name)
    mlflow.log_params(flat(cfg.to_dict()))
    return mlflow


def flat(x, prefix: str = "") -> dict:
    """The config as verl's MLflow parameters: nested keys joined by "/", a list as its length and its items."""
    if isinstance(x, list):
        x = {"list_len": len(x), **{str(i): v for i, v in enumerate(x)}}
    if not isinstance(x, dict):
        return {prefix: x}
    out = {}
    for k, v in x.items():
        out.update(flat(v, f"{prefix}/{k}" if prefix else str(k)))
    return out


def mlflow_key(key: str) -> str:
    """A metric name as MLflow takes it, as verl rewrites it: @ as _at_, one slash at a time, other characters
    MLflow refuses as _."""
    key = re.sub(r"/+", "/", key.replace("@", "_at_"))
    return re.sub(r"[^/\w.\- :]", "_", key)


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


@functools.cache
def _this_process():
    import psutil

    return psutil.Process()


def rss_gb() -> float:
    return _this_process().memory_info().rss / 1024**3
