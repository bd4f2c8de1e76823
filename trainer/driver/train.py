"""The PPO/GRPO driver on the head, as named stages: prepare (driver/prepare.py: model, data and every check that
needs no worker), start the workers and the mode over them (driver/modes.py), resume, the loop, shut down."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..config.validation import rollout_is_refusal
from ..errors import ConfigError
from ..workers.profiling import StepWindows, snapshots_after_update
from . import checkpoint, preemption, stacks
from .launch import Workers, describe_placement, start_workers
from .modes import Mode, mode_of
from .prepare import prepare
from .reporting import MetricsLog, progress, rss_gb, say
from .rollout_pool import STOP_WAIT_S
from .stages import Prepared, Progress
from .watchdog import Watchdog

# after a failed run, how long the driver waits for the workers to shut down and end before it reports the failure
FAILED_STOP_WAIT_S = 20.0


@dataclass(frozen=True)
class Started:
    """What start adds to the prepared run: the workers, the mode that generates and trains over them, and the
    watchdog over their phases (not yet started)."""

    workers: Workers
    mode: Mode
    watchdog: Watchdog


def start(prep: Prepared, mode: type[Mode]) -> Started:
    """The workers, and the one check that needs them: the engine that rollout.name=auto chose."""
    import ray

    cfg = prep.cfg
    workers = start_workers(cfg, prep.model_path, prep.rm_path)
    say("workers on " + ", ".join(ray.get([w.node_ip.remote() for w in workers.training])))
    say(describe_placement(cfg, workers, prep.rm_path))
    engines = sorted(set(ray.get([w.engine_name.remote() for w in workers.rollout or workers.training])))
    # a rollout pool of its own reports its samples' log-probs whatever the engine (workers/rollout_worker.py)
    refusals = [rollout_is_refusal(cfg.algorithm.rollout_correction, name) for name in engines if not workers.rollout]
    if any(refusals):
        raise ConfigError(next(r for r in refusals if r))
    say(f"rollout engine: {', '.join(engines)}")
    return Started(workers, mode.start(prep, workers, engines), watchdog(prep, workers))


def watchdog(prep: Prepared, w: Workers) -> Watchdog:
    """The watchdog over the training workers' phases; a hang dumps every worker's stack, the pools' too."""
    import ray

    labelled = [(f"rank {i}", h) for i, h in enumerate(w.training)]
    labelled += [(f"{prefix.rsplit('.', 1)[-1]} {i}", h) for prefix, hs in w.pools.items() for i, h in enumerate(hs)]
    found = ray.get([h.whereabouts.remote() for _, h in labelled])
    procs = [stacks.Proc(label, **where) for (label, _), where in zip(labelled, found)]
    reporting = [label for label, _ in labelled[: len(w.training)]]
    reporting += [f"rollout {i}" for i in range(len(w.rollout))]  # a rollout pool's workers report their phases too
    return Watchdog(prep.cfg, prep.out, procs, reporting, lambda: [ray.kill(h) for _, h in labelled])


def resume(prep: Prepared, started: Started) -> Progress:
    """From the checkpoint prepare() chose, or a fresh log."""
    log_path = prep.out / "metrics.jsonl"
    if prep.resume_from is None:
        if log_path.exists():
            log_path.unlink()  # a fresh run starts a fresh log
        return Progress()
    ts = checkpoint.restore(prep, started.workers)
    at = Progress(ts["global_step"])
    started.mode.resume(at.step, ts)
    prep.kl_ctrl.value = ts["kl_coef"]
    dropped = preemption.truncate_metrics(log_path, at.step)
    say(
        f"resumed from {prep.resume_from} at step {at.step}"
        + (f" (dropped {dropped} logged steps after it)" if dropped else "")
        + (f"; restart {preemption.restarts()} in place" if preemption.restarts() else "")
    )
    return at


def save(prep: Prepared, started: Started, at: Progress) -> None:
    extras = started.mode.checkpoint_extras()
    checkpoint.write(prep, started.workers, at.step, at.data_at(prep.sampler), extras)


def on_every_worker(workers: Workers, method: str, *args) -> None:
    import ray

    ray.get([getattr(w, method).remote(*args) for w in workers.every])


def train_step(prep: Prepared, started: Started, at: Progress) -> dict | None:
    """One step, validation and a checkpoint when due, and the step's metrics (None: the fully async mode's prompts
    ran out before it); in the steps of global_profiler.steps recorded, validation and checkpoint included, as verl
    records them."""
    import ray

    cfg, mode, workers = prep.cfg, started.mode, started.workers
    windows = StepWindows.of(cfg)
    if windows.starts(at.step):
        on_every_worker(workers, "start_profile", at.step)
    t0 = time.perf_counter()
    m = mode.step(at)
    if m is None:
        return None
    last = at.step == prep.total or mode.exhausted()
    if mode.test_freq > 0 and (at.step % mode.test_freq == 0 or last):
        tv = time.perf_counter()
        m.update(mode.validate(at.step))
        m["timing_s/testing"] = time.perf_counter() - tv
    if cfg.trainer.save_freq > 0 and (at.step % cfg.trainer.save_freq == 0 or last):
        ts0 = time.perf_counter()
        save(prep, started, at)
        m["timing_s/save_checkpoint"] = time.perf_counter() - ts0
    dt = time.perf_counter() - t0
    m.update(
        {
            "training/global_step": at.step,
            "training/epoch": at.data_at(prep.sampler)[0],
            "training/restarts": preemption.restarts(),
            "timing_s/step": dt,
            "perf/time_per_step": dt,
            "perf/throughput": m["perf/total_num_tokens"] / (dt * len(workers.training)),
            "perf/cpu_memory_used_gb": rss_gb(),
        }
    )
    if windows.stops(at.step):
        on_every_worker(workers, "stop_profile")
    if snapshots_after_update(cfg):
        ray.get([w.after_update.remote(at.step) for w in workers.training])
    return m


def loop(prep: Prepared, started: Started, at: Progress, log: MetricsLog) -> preemption.StopRequest:
    """Steps until the last or a stop signal; a signal's step in flight finishes and is checkpointed."""
    started_s, first = time.monotonic(), at.step + 1
    stop, saved_at = preemption.StopRequest(), None
    while at.step < prep.total and stop.signum is None and not started.mode.exhausted():
        at.step += 1
        m = train_step(prep, started, at)
        if m is None:  # the fully async mode's prompts ran out (stale ones dropped) before this step's first update
            at.step -= 1
            if prep.cfg.trainer.save_freq > 0 and saved_at != at.step:
                save(prep, started, at)  # the last step is the one before, which did not know it was
                saved_at = at.step
            break
        started.watchdog.record(m)
        if "timing_s/save_checkpoint" in m:
            saved_at = at.step
        log.log(at.step, m)
        progress(at.step, prep.total, m, started_s, first)
    if stop.signum is not None and saved_at != at.step:
        save(prep, started, at)
    if StepWindows.of(prep.cfg).left_open(at.step):
        on_every_worker(started.workers, "stop_profile")
    return stop


def shut_down(prep: Prepared, started: Started) -> None:
    import ray

    started.mode.close()
    ray.get([w.shutdown.remote() for w in started.workers.ended_by_driver])
    if prep.cfg.ray_kwargs.timeline_json_file:
        ray.timeline(filename=prep.cfg.ray_kwargs.timeline_json_file)
    # each worker's process ends as it would on its own (PoolWorker.exit), not when the job's end kills it; one that
    # has not after STOP_WAIT_S is left to that
    exits = [w.exit.remote() for w in started.workers.ended_by_driver]
    ray.wait(exits, num_returns=len(exits), timeout=STOP_WAIT_S)


def release_after_failure(started: Started) -> None:
    """After the run failed: every worker that answers within FAILED_STOP_WAIT_S shuts down and ends as at a run's
    end, so the engines it started go with their shared memory; one still in the failed step (a peer waiting in a
    collective) is left to the job's end. What a worker raises on the way is said, not raised over the failure."""
    import ray

    started.mode.close()
    workers = started.workers.ended_by_driver
    shutdowns = [w.shutdown.remote() for w in workers]
    exits = [w.exit.remote() for w in workers]  # an actor runs its calls in order: each after its shutdown
    ray.wait(exits, num_returns=len(exits), timeout=FAILED_STOP_WAIT_S)
    done, _ = ray.wait(shutdowns, num_returns=len(shutdowns), timeout=0)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError:  # a worker that had died with the failure: nothing of it to release
            pass
        except Exception as e:  # noqa: BLE001 - said beside the failure that ends the run
            say(f"shutting a worker down after the failure: {type(e).__name__}: {e}")


def train(cfg) -> int:
    mode = mode_of(cfg)
    prep = prepare(cfg, mode)
    started = start(prep, mode)
    t, metrics_file = prep.cfg.trainer, prep.out / "metrics.jsonl"
    log = MetricsLog(prep.cfg, metrics_file)
    try:
        at = resume(prep, started)
        started.watchdog.start()
        try:
            if (t.val_before_train and at.step == 0 or t.val_only) and prep.val_rows:
                m = started.mode.validate(at.step)
                say(f"validation at step {at.step}: {m}")
                log.log(at.step, {"training/global_step": at.step, **m})
            stop = None if t.val_only else loop(prep, started, at, log)
        finally:
            started.watchdog.stop()
    except BaseException:
        release_after_failure(started)
        raise
    shut_down(prep, started)
    if stop is None:
        say(f"trainer.val_only: validated, not trained; metrics in {metrics_file}")
        return 0
    if stop.signum is not None:
        say(f"stopped by signal after step {at.step}, checkpoint written; a relaunch resumes at step {at.step + 1}")
        return stop.exit_code
    say(f"done: {at.step} steps; metrics in {metrics_file}")
    return 0
