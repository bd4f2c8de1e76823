"""The PPO/GRPO driver on the head, as named stages: prepare (model, data and every check that needs no
worker), start the workers, resume, the loop, shut down."""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import metrics as M
from .. import mlflow_store
from ..config.validation import micro_batch_refusal, profiler_device_refusal, rollout_is_refusal
from ..data.custom_sampler import CustomSampler, make_sampler
from ..data.sampler import Sampler
from ..errors import ConfigError
from ..model import lora
from ..workers.profiling import StepWindows, snapshots_after_update
from . import checkpoint, curriculum, faults, preemption, stacks
from .fully_async import Stream, total_versions, version_step
from .launch import Workers, describe_placement, start_workers, uses_gpu
from .reporting import MetricsLog, progress, rss_gb, say
from .rollout_pool import RolloutPool, Share
from .validation import validate_rows
from .watchdog import Watchdog


@dataclass
class Run:
    """What the stages share: the resolved config, what was prepared, and the run's progress."""

    cfg: object
    model_path: str
    rm_path: str | None
    adapter: dict | None  # the LoRA adapter's shape (lora.check), which a resume must match and export rebuilds
    train_rows: list[dict]
    val_rows: list[dict]
    sampler: Sampler | CustomSampler
    kl_ctrl: object
    out: Path
    resume_from: Path | None
    faults: list[faults.FaultHang] = dataclasses.field(default_factory=list)  # RLRIG_FAULT_HANG's (tests)
    pad_id: int = 0  # the tokenizer's padding token (its EOS where it has none), as the workers pad
    workers: Workers | None = None
    pool: RolloutPool | None = None  # the rollout pool's schedule (hybrid_engine=False)
    stream: Stream | None = None  # the fully async mode's queue over the pool
    total: int = 0  # steps in the run: updates, or weight versions in the fully async mode
    updates: int = 0  # updates in the run (the workers' learning-rate schedules count them)
    watchdog: Watchdog | None = None
    log: MetricsLog | None = None
    step: int = 0
    # where the data stood after the last trained batch, when a batch drawn after it is in flight (one step off-policy)
    data_at: tuple[int, int] | None = None


def equal_shares(rows: list, parts: int) -> list[list]:
    """`rows` cut into `parts` consecutive shares of len(rows) // parts each (config validation keeps a batch a
    multiple of the workers, so nothing is left over)."""
    size = len(rows) // parts
    return [rows[i * size : (i + 1) * size] for i in range(parts)]


def update_kl_controller(kl_ctrl, m: dict, cfg) -> None:
    """After a step with KL in the reward: adapt the coefficient by the batch's number of samples
    (prompts x n, as verl passes it), and log it."""
    if "actor/reward_kl_penalty" in m:
        kl_ctrl.update(m["actor/reward_kl_penalty"], cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n)
        m["actor/reward_kl_penalty_coeff"] = kl_ctrl.value


def with_runtime(cfg, total_steps: int, device: str):
    """The config the workers get: the total number of steps (the learning-rate schedules need it; verl injects
    it the same way) and the device trainer.device=auto resolved to."""
    t = dataclasses.replace(cfg.trainer, total_training_steps=total_steps, device=device)
    return dataclasses.replace(cfg, trainer=t)


def checkpoint_loads(cfg) -> dict:
    """Each checkpointed role's load_contents, by config prefix."""
    loads = {"actor_rollout_ref.actor": cfg.actor_rollout_ref.actor.checkpoint.loads}
    if cfg.critic_in_use:
        loads["critic"] = cfg.critic.checkpoint.loads
    return loads


def prepare(cfg) -> Run:
    """Ray, the tokenizer, the data and every check that needs no worker: a bad input stops here, before any
    worker is placed."""
    import ray

    from ..agent import setup as agent_setup
    from ..algos import core_algos
    from ..data.datasets import load_rows
    from ..embedded.tiny_model import ensure_tiny_model
    from ..model.build import import_external_lib, load_kwargs, load_tokenizer
    from ..reward.reward_model import check_installed, resolve_path
    from ..reward.rules import check_reward_setup

    model_path = cfg.actor_rollout_ref.model.path or ensure_tiny_model()
    if cfg.ray_kwargs.ray_init.num_cpus is not None and not os.environ.get("RAY_ADDRESS"):
        ray.init(num_cpus=cfg.ray_kwargs.ray_init.num_cpus)
    else:
        ray.init(log_to_driver=True)
    model_cfg = cfg.actor_rollout_ref.model
    import_external_lib(model_cfg)
    tokenizer = load_tokenizer(cfg, model_path)
    if cfg.actor_rollout_ref.actor.use_prefix_grouper:
        from ..model import prefix_grouper

        prefix_grouper.check(model_path, load_kwargs(model_cfg))
    adapter = lora.check(model_cfg, model_path, load_kwargs(model_cfg)) if model_cfg.uses_lora else None
    train_rows, val_rows = load_rows(cfg, tokenizer)
    mlflow_store.require(cfg)
    notice = agent_setup.check(cfg, train_rows + val_rows)
    if notice:
        say(notice)
    check_reward_setup(cfg, {r["data_source"] for r in train_rows + val_rows})
    check_installed(cfg.reward_model)
    rm_path = resolve_path(cfg.reward_model) if cfg.reward_model.enable else None
    t = cfg.trainer
    sampler = make_sampler(cfg.data, train_rows, cfg.data.train_batch_size)
    curriculum.check(cfg, sampler)
    if sampler.steps_per_epoch() < 1:
        raise ConfigError(
            f"data.train_batch_size={cfg.data.train_batch_size} is larger than the {len(train_rows)} training prompts"
        )
    total = t.total_training_steps or sampler.steps_per_epoch() * t.total_epochs
    updates = total
    if t.async_mode == "fully_async_policy":  # prompts drawn one at a time; a step is a weight version
        sampler.batch = 1
        updates, total = total_versions(cfg, len(train_rows))
        if total < 1:
            raise ConfigError(
                f"rollout.total_rollout_steps={cfg.rollout.total_rollout_steps} prompts do not fill one update of "
                f"{cfg.data.train_batch_size} (async_training.require_batches x ppo_mini_batch_size); raise it"
            )
        if t.test_freq > 0:
            say(
                f"trainer.test_freq={t.test_freq} is not read in the fully async mode (nor by verl's); validation "
                f"follows rollout.test_freq={cfg.rollout.test_freq} weight versions"
            )
    # the workers' learning-rate schedules count updates
    cfg = with_runtime(cfg, updates, "cuda" if uses_gpu(cfg) else "cpu")
    # trainer.device=auto chose GPUs or CPUs
    why = micro_batch_refusal(cfg) if cfg.trainer.device == "cuda" else profiler_device_refusal(cfg)
    if why:
        raise ConfigError(why)
    out = Path(t.default_local_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.clean_partial(str(out))
    preemption.keep_fabric_report(out)
    say(
        f"model {model_path}; {len(train_rows)} prompts; {total} steps; {t.nnodes}x{t.n_gpus_per_node} workers; "
        f"rollout {cfg.actor_rollout_ref.rollout.name}"
    )
    resume_from = None
    if t.resume_mode == "resume_path":
        resume_from = Path(t.resume_from_path)
    elif t.resume_mode == "auto":
        resume_from = checkpoint.latest(str(out))
    if resume_from is not None:
        ts = checkpoint.trainer_state(resume_from)
        lora.check_resume(ts.get("lora"), adapter, resume_from)
        why = checkpoint.load_refusal(resume_from, ts.get("contents", {}), checkpoint_loads(cfg))
        if why:
            raise ConfigError(why)
    kl_ctrl = core_algos.kl_controller(cfg.algorithm.kl_ctrl)
    rollout_world = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if not cfg.actor_rollout_ref.hybrid_engine else 0
    injected = faults.from_env(t.nnodes * t.n_gpus_per_node, rollout_world)
    run = Run(cfg, model_path, rm_path, adapter, train_rows, val_rows, sampler, kl_ctrl, out, resume_from, injected)
    run.total, run.updates = total, updates
    run.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return run


def start(run: Run) -> None:
    """The workers, and the one check that needs them: the engine that rollout.name=auto chose."""
    import ray

    cfg = run.cfg
    run.workers = workers = start_workers(cfg, run.model_path, run.rm_path)
    say("workers on " + ", ".join(ray.get([w.node_ip.remote() for w in workers.training])))
    say(describe_placement(cfg, workers, run.rm_path))
    engines = sorted(set(ray.get([w.engine_name.remote() for w in workers.rollout or workers.training])))
    # a rollout pool of its own reports its samples' log-probs whatever the engine (workers/rollout_worker.py)
    refusals = [rollout_is_refusal(cfg.algorithm.rollout_correction, name) for name in engines if not workers.rollout]
    if any(refusals):
        raise ConfigError(next(r for r in refusals if r))
    say(f"rollout engine: {', '.join(engines)}")
    if workers.rollout:
        one_step = cfg.trainer.async_mode == "one_step_off_policy"
        run.pool = RolloutPool(workers.rollout, workers.training, cfg.actor_rollout_ref.rollout.n, run.pad_id, one_step)
        run.pool.connect()
        if cfg.trainer.async_mode == "fully_async_policy":
            interruptible = ray.get([w.interruptible.remote() for w in workers.rollout])
            if cfg.async_training.partial_rollout and not all(interruptible):
                raise ConfigError(
                    "async_training.partial_rollout=True: rlrig interrupts a generation at a weight sync in its hf "
                    f"and vLLM engines, not {', '.join(engines)}; set async_training.partial_rollout=False "
                    "(generations in flight then finish under the weights they started with)"
                )
            run.stream = Stream(run.pool, run.train_rows, cfg, run.sampler, run.updates)
        say(f"rollout pool: {len(workers.rollout)} engine(s), {cfg.trainer.async_mode}")
    run.watchdog = watchdog(run)


def watchdog(run: Run) -> Watchdog:
    """The watchdog over the training workers' phases; a hang dumps every worker's stack, the pools' too."""
    import ray

    w = run.workers
    labelled = [(f"rank {i}", h) for i, h in enumerate(w.training)]
    labelled += [(f"{prefix.rsplit('.', 1)[-1]} {i}", h) for prefix, hs in w.pools.items() for i, h in enumerate(hs)]
    found = ray.get([h.whereabouts.remote() for _, h in labelled])
    procs = [stacks.Proc(label, **where) for (label, _), where in zip(labelled, found)]
    reporting = [label for label, _ in labelled[: len(w.training)]]
    reporting += [f"rollout {i}" for i in range(len(w.rollout))]  # a rollout pool's workers report their phases too
    return Watchdog(run.cfg, run.out, procs, reporting, lambda: [ray.kill(h) for _, h in labelled])


def resume(run: Run) -> None:
    """From the checkpoint prepare() chose, or a fresh log."""
    import ray

    log_path = run.out / "metrics.jsonl"
    if run.resume_from is None:
        if log_path.exists():
            log_path.unlink()  # a fresh run starts a fresh log
        return
    state, rngs, ts = checkpoint.load(run.resume_from)
    if "extra" not in run.cfg.actor_rollout_ref.actor.checkpoint.loads:
        rngs = []  # the workers keep the random streams they started with
    w = run.workers
    ray.get(
        [t.load.remote(state, rngs[i] if i < len(rngs) else None) for i, t in enumerate(w.training)]
        + [c.load.remote(state) for c in w.critics]
    )
    run.step, run.sampler.epoch, run.sampler.pos = ts["global_step"], ts["epoch"], ts["pos"]
    if isinstance(run.sampler, CustomSampler):
        run.sampler.restore(run.resume_from)
    if run.pool is not None:
        run.pool.trained = run.step
    if run.stream is not None:  # the prompts the checkpoint's run drew and did not train: generated first
        # a checkpoint of another mode has none pending, and made one update a step
        run.stream.todo.extend(ts.get("pending", []))
        run.stream.updates = ts.get("updates", run.step)
    run.kl_ctrl.value = ts["kl_coef"]
    dropped = preemption.truncate_metrics(log_path, run.step)
    say(
        f"resumed from {run.resume_from} at step {run.step}"
        + (f" (dropped {dropped} logged steps after it)" if dropped else "")
        + (f"; restart {preemption.restarts()} in place" if preemption.restarts() else "")
    )


def validate(run: Run) -> dict:
    """On the training workers' engines, or on the rollout pool with the weights just trained (after the batch it
    may be generating)."""
    if run.pool is None:
        return validate_rows(run.workers.training, run.val_rows, run.cfg, run.step, run.out)
    run.pool.settle()
    m = run.pool.push()
    return {**validate_rows(run.workers.rollout, run.val_rows, run.cfg, run.step, run.out), **m}


def save(run: Run) -> None:
    """A checkpoint at run.step: the training workers' state (with the critic pool's, if it has one) and every
    worker's random streams, as each role's checkpoint.save_contents asks, and where the data and the KL controller
    stand (always)."""
    import ray

    cfg, w = run.cfg, run.workers
    state = ray.get([t.state.remote() for t in w.training])[0]  # under FSDP gathering the state is a collective
    if w.critics:
        state.update(ray.get([c.state.remote() for c in w.critics])[0])
    actor_saves, critic_saves = (
        cfg.actor_rollout_ref.actor.checkpoint.save_contents,
        cfg.critic.checkpoint.save_contents,
    )
    rngs = ray.get([t.rng_state.remote() for t in w.training]) if "extra" in actor_saves else []
    contents = {"actor": list(actor_saves)}
    if cfg.critic_in_use:
        contents["critic"] = list(critic_saves)
    epoch, pos = run.data_at or (run.sampler.epoch, run.sampler.pos)
    trainer_state = {
        "global_step": run.step,
        "epoch": epoch,
        "pos": pos,
        "kl_coef": run.kl_ctrl.value,
        "model_path": run.model_path,
        "gguf_file": cfg.actor_rollout_ref.model.gguf_file,
        "lora": run.adapter,
        "contents": contents,
    }
    if run.stream is not None:
        trainer_state.update(pending=run.stream.pending(), updates=run.stream.updates)
    writes = [w for w in (hf_models(run, state, contents), sampler_writer(run)) if w is not None]
    for role, key in (("actor", "model"), ("critic", "critic")):  # weights gathered for hf_model alone
        if "model" not in contents.get(role, []):
            state.pop(key, None)
    more = (lambda d: [write(d) for write in writes]) if writes else None
    checkpoint.save(str(run.out), run.step, state, rngs, trainer_state, more)


def sampler_writer(run: Run):
    """What writes a sampler of the user's own's state (its state_dict) into a step's directory; None: it has none."""
    state = run.sampler.state() if isinstance(run.sampler, CustomSampler) else None
    return None if state is None else (lambda d: CustomSampler.save(state, d))


def hf_models(run: Run, state: dict, contents: dict):
    """What writes <role>/huggingface into a step's directory for each role whose save_contents names hf_model."""
    from ..model.hf_export import write_hf_model

    a, c = run.cfg.actor_rollout_ref.model, run.cfg.critic.model
    jobs = []
    if "hf_model" in contents["actor"]:
        jobs.append(
            lambda d: write_hf_model(
                state["model"], run.model_path, d / "actor" / "huggingface", a.gguf_file, run.adapter
            )
        )
    if "hf_model" in contents.get("critic", []):
        base, gguf = (c.path, c.gguf_file) if c.path else (run.model_path, a.gguf_file)
        jobs.append(
            lambda d: write_hf_model(state["critic"], base, d / "critic" / "huggingface", gguf, value_head=True)
        )
    return (lambda d: [job(d) for job in jobs]) if jobs else None


def on_every_worker(run: Run, method: str, *args) -> None:
    import ray

    ray.get([getattr(w, method).remote(*args) for w in run.workers.every])


def arm_rollout_faults(run: Run, step: int) -> None:
    """RLRIG_FAULT_HANG's rollout_gen faults for the batch of `step`, armed before it starts generating."""
    for fault in faults.due([f for f in run.faults if f.phase == "rollout_gen"], step, run.out):
        say(f"{faults.ENV}: rollout {fault.rank} hangs in rollout_gen at step {step}")
        run.pool.workers[fault.rank].arm_fault.remote(fault.phase)


def pooled_rollout(run: Run, batch: list[dict], workers: int) -> tuple[list[Share], dict]:
    """The rollout pool's samples of this step's batch, a share per training worker, and its metrics. One step
    off-policy, the next batch is drawn and starts generating before this one trains; run.data_at keeps where the
    data stood before it, which is what a checkpoint of this step records."""
    pool, pooled = run.pool, {}
    run.data_at = None
    if pool.in_flight is None:
        pooled.update(pool.push())
        arm_rollout_faults(run, run.step)
        pool.launch(run.step, batch)
    ro, turns, waited = pool.take(run.step)
    pooled.update(waited)
    if pool.one_step and run.step < run.total:
        pooled.update(pool.push())
        run.data_at = (run.sampler.epoch, run.sampler.pos)
        arm_rollout_faults(run, run.step + 1)
        pool.launch(run.step + 1, [run.train_rows[i] for i in run.sampler.next()])
    return pool.shares(ro, turns, batch, workers), pooled


def arm_training_faults(run: Run) -> None:
    """RLRIG_FAULT_HANG's faults of the training ranks due at this step."""
    for fault in faults.due([f for f in run.faults if f.phase != "rollout_gen"], run.step, run.out):
        say(f"{faults.ENV}: rank {fault.rank} hangs in {fault.phase} at step {run.step}")
        run.workers.training[fault.rank].arm_fault.remote(fault.phase)


def step_on(worker, share: Share, kl: float, step: int, local: int | None = None, keep: bool = False):
    """A training worker's step on its share of a rollout pool's samples."""
    return worker.step.remote(share.rows, kl, step, share.samples, local, share.turns, keep, share.first_sample)


def batch_step(run: Run) -> dict:
    """One update on this step's batch: generated by the training workers' engines or by the rollout pool."""
    import ray

    workers, pool = run.workers.training, run.pool
    if pool is not None and pool.in_flight is not None:
        batch = pool.in_flight.rows  # drawn and generating since the step before (one step off-policy)
    else:
        batch = [run.train_rows[i] for i in run.sampler.next()]
    shares, pooled = (
        pooled_rollout(run, batch, len(workers)) if pool is not None else (equal_shares(batch, len(workers)), {})
    )
    arm_training_faults(run)
    kl, keep = run.kl_ctrl.value, run.sampler.curriculum
    steps = [
        step_on(w, s, kl, run.step, keep=keep) if pool is not None else w.step.remote(s, kl, run.step, keep=keep)
        for w, s in zip(workers, shares)
    ]
    m = M.reduce(ray.get(steps))
    if keep:
        curriculum.hand_over(run, batch)
    m.update(pooled)
    if pool is not None:
        pool.trained = run.step
    update_kl_controller(run.kl_ctrl, m, run.cfg)
    return m


def stream_step(run: Run) -> dict | None:
    """The fully async mode's step: one weight version of updates on samples as they stream in (None: the prompts
    ran out before one)."""
    workers = run.workers.training

    def start_update(rows: list[dict], ro, turns: list[dict], local: int) -> list:
        if local == 1:
            arm_training_faults(run)
            arm_rollout_faults(run, run.step)
        shares = run.pool.shares(ro, turns, rows, len(workers))
        return [step_on(w, s, run.kl_ctrl.value, run.stream.updates, local) for w, s in zip(workers, shares)]

    return version_step(run, start_update, lambda m: update_kl_controller(run.kl_ctrl, m, run.cfg))


def train_step(run: Run) -> dict | None:
    """One step, validation and a checkpoint when due, and the step's metrics (None: the fully async mode's prompts
    ran out before it); in the steps of global_profiler.steps recorded, validation and checkpoint included, as verl
    records them."""
    import ray

    cfg, t, workers = run.cfg, run.cfg.trainer, run.workers.training
    total, windows = run.total, StepWindows.of(cfg)
    if windows.starts(run.step):
        on_every_worker(run, "start_profile", run.step)
    t0 = time.perf_counter()
    m = stream_step(run) if run.stream is not None else batch_step(run)
    if m is None:
        return None
    # the fully async mode validates every rollout.test_freq weight versions (verl's), and after the last
    test_freq = cfg.rollout.test_freq if run.stream is not None else t.test_freq
    last = run.step == total or (run.stream is not None and run.stream.exhausted())
    if test_freq > 0 and (run.step % test_freq == 0 or last):
        tv = time.perf_counter()
        m.update(validate(run))
        m["timing_s/testing"] = time.perf_counter() - tv
    if t.save_freq > 0 and (run.step % t.save_freq == 0 or last):
        ts0 = time.perf_counter()
        save(run)
        m["timing_s/save_checkpoint"] = time.perf_counter() - ts0
    dt = time.perf_counter() - t0
    m.update(
        {
            "training/global_step": run.step,
            "training/epoch": run.data_at[0] if run.data_at else run.sampler.epoch,
            "training/restarts": preemption.restarts(),
            "timing_s/step": dt,
            "perf/time_per_step": dt,
            "perf/throughput": m["perf/total_num_tokens"] / (dt * len(workers)),
            "perf/cpu_memory_used_gb": rss_gb(),
        }
    )
    if windows.stops(run.step):
        on_every_worker(run, "stop_profile")
    if snapshots_after_update(cfg):
        ray.get([w.after_update.remote(run.step) for w in workers])
    return m


def loop(run: Run) -> preemption.StopRequest:
    """Steps until the last or a stop signal; a signal's step in flight finishes and is checkpointed."""
    total = run.total
    started, first = time.monotonic(), run.step + 1
    stop, saved_at = preemption.StopRequest(), None
    while run.step < total and stop.signum is None and not (run.stream is not None and run.stream.exhausted()):
        run.step += 1
        m = train_step(run)
        if m is None:  # the fully async mode's prompts ran out (stale ones dropped) before this step's first update
            run.step -= 1
            if run.cfg.trainer.save_freq > 0 and saved_at != run.step:
                save(run)  # the last step is the one before, which did not know it was
                saved_at = run.step
            break
        run.watchdog.record(m)
        if "timing_s/save_checkpoint" in m:
            saved_at = run.step
        run.log.log(run.step, m)
        progress(run.step, total, m, started, first)
    if stop.signum is not None and saved_at != run.step:
        save(run)
    if StepWindows.of(run.cfg).left_open(run.step):
        on_every_worker(run, "stop_profile")
    return stop


def shut_down(run: Run) -> None:
    import ray

    if run.pool is not None:
        run.pool.stop()
    ray.get([w.shutdown.remote() for w in run.workers.stateful])
    if run.cfg.ray_kwargs.timeline_json_file:
        ray.timeline(filename=run.cfg.ray_kwargs.timeline_json_file)


def train(cfg) -> int:
    run = prepare(cfg)
    start(run)
    resume(run)
    t, metrics_file = run.cfg.trainer, run.out / "metrics.jsonl"
    run.log = MetricsLog(run.cfg, metrics_file)
    run.watchdog.start()
    try:
        if (t.val_before_train and run.step == 0 or t.val_only) and run.val_rows:
            m = validate(run)
            say(f"validation at step {run.step}: {m}")
            run.log.log(run.step, {"training/global_step": run.step, **m})
        stop = None if t.val_only else loop(run)
    finally:
        run.watchdog.stop()
    shut_down(run)
    if stop is None:
        say(f"trainer.val_only: validated, not trained; metrics in {metrics_file}")
        return 0
    if stop.signum is not None:
        say(f"stopped by signal after step {run.step}, checkpoint written; a relaunch resumes at step {run.step + 1}")
        return stop.exit_code
    say(f"done: {run.step} steps; metrics in {metrics_file}")
    return 0
