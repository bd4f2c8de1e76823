"""The training worker without Ray: one rank in this process (Gloo on CPU, NCCL on one GPU), fed
batches as the driver would. For the GPU tests and the benchmarks, which measure the worker itself."""

from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def single_worker(overrides: list[str], model_path: str | None = None):
    """(worker, batches): `batches()` yields each step's prompt rows as the driver's sampler would."""
    from rlrig.entrypoint.cluster.ports import kernel_free_port

    from ..agent.setup import tool_schemas
    from ..config.overrides import parse_overrides
    from ..data.custom_sampler import make_sampler
    from ..data.datasets import load_rows
    from ..embedded.tiny_model import ensure_tiny_model
    from ..errors import ConfigError
    from ..model.loading import load_tokenizer
    from ..workers.training_worker import TrainingWorker
    from .prepare import with_runtime

    cfg = parse_overrides([*overrides, "trainer.n_gpus_per_node=1", "trainer.nnodes=1"])
    path = model_path or cfg.actor_rollout_ref.model.path or ensure_tiny_model()
    rows, _ = load_rows(cfg, load_tokenizer(cfg, path), tool_schemas(cfg.data.tool_config_path))
    import torch

    # trainer.device=auto resolved as the driver does for its workers, here from this process's own devices
    device = (
        "cuda" if cfg.trainer.device == "cuda" or cfg.trainer.device == "auto" and torch.cuda.is_available() else "cpu"
    )
    cfg = with_runtime(cfg, cfg.trainer.total_training_steps or len(rows) // cfg.data.train_batch_size, device)
    sampler = make_sampler(cfg.data, rows, cfg.data.train_batch_size)
    if sampler.curriculum:  # its update needs the driver's step (driver/curriculum.py)
        raise ConfigError("data.sampler: a curriculum sampler runs under rlrig train, not the single worker")
    if cfg.algorithm.filter_groups.enable:  # the driver draws and keeps the groups (driver/dynamic_sampling.py)
        raise ConfigError(
            "algorithm.filter_groups.enable=True: dynamic sampling runs under rlrig train, not the single worker"
        )
    from ..reward.reward_model import resolve_path

    rm_path = resolve_path(cfg.reward_model) if cfg.reward_model.enable else None  # colocated: scored in this process
    w = TrainingWorker(cfg.to_dict(), 0, 1, ("127.0.0.1", kernel_free_port()), path, rm_path)
    if w.refused is not None:
        raise ConfigError(w.refused)

    def batches():
        while True:
            yield [rows[i] for i in sampler.next()]

    try:
        yield w, batches()
    finally:
        w.shutdown()


def run_steps(overrides: list[str], steps: int, model_path: str | None = None) -> list[dict]:
    """The metrics of `steps` steps, the steps of global_profiler.steps recorded as the driver records them."""
    from ..workers.profiling import StepWindows
    from ..workers.step.request import StepRequest

    with single_worker(overrides, model_path) as (w, batches):
        kl, windows, out = w.cfg.algorithm.kl_ctrl.kl_coef, StepWindows.of(w.cfg), []
        for step in range(1, steps + 1):
            if windows.starts(step):
                w.start_profile(step)
            out.append(w.step(StepRequest(next(batches), global_step=step, kl_coef=kl)))
            if windows.stops(step) or step == steps and windows.left_open(step):
                w.stop_profile()
        return out
