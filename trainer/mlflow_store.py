"""The MLflow store rlrig writes to, as verl does: MLFLOW_TRACKING_URI, else verl's sqlite:////tmp/mlruns.db, and
the experiment trainer.project_name. Used by trainer.logger=mlflow (the driver's metrics) and by
actor_rollout_ref.rollout.trace.backend=mlflow (the agent loop's traces, in the processes that run it)."""

from __future__ import annotations

import os

from .errors import ConfigError

DEFAULT_URI = "sqlite:////tmp/mlruns.db"  # verl's


def users(cfg) -> list[str]:
    """The config keys asking for MLflow."""
    out = ["trainer.logger=mlflow"] if "mlflow" in cfg.trainer.logger else []
    if cfg.actor_rollout_ref.rollout.trace.backend == "mlflow":
        out.append("actor_rollout_ref.rollout.trace.backend=mlflow")
    return out


def require(cfg) -> None:
    """At start-up, before any worker: MLflow is installed where a key asks for it."""
    asking = users(cfg)
    if not asking:
        return
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise ConfigError(f"{asking[0]}: MLflow is not installed; pip install 'rlrig[mlflow]'") from None


def experiment_id(project: str) -> str:
    """The tracking URI set for this process, and the project's experiment (made if new)."""
    import mlflow

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", DEFAULT_URI))
    return mlflow.set_experiment(project).experiment_id
