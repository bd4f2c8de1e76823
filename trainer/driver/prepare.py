"""The driver's first stage: Ray, the tokenizer, the data and every check that needs no worker, so that a bad input
stops here, before any worker is placed. Its stages run in this order; a refusal names the first thing to fix."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from .. import determinism, mlflow_store
from ..config.validation import (
    attention_refusal,
    kernel_device_refusal,
    micro_batch_refusal,
    profiler_device_refusal,
)
from ..data.custom_sampler import make_sampler
from ..errors import ConfigError
from ..model import compiled, lora
from ..rollout import weight_sync
from . import checkpoint, curriculum, faults, preemption
from .launch import uses_gpu
from .modes import Mode
from .reporting import say
from .stages import Prepared


def with_runtime(cfg, total_steps: int, device: str):
    """The config the workers get: the total number of steps (the learning-rate schedules need it; verl injects
    it the same way) and the device trainer.device=auto resolved to."""
    t = dataclasses.replace(cfg.trainer, total_training_steps=total_steps, device=device)
    return dataclasses.replace(cfg, trainer=t)


def prepare(cfg, mode: type[Mode]) -> Prepared:
    """The run ready for its workers, in `mode` (modes.mode_of), or a ConfigError."""
    from ..agent.setup import tool_schemas
    from ..algos import core_algos
    from ..data.datasets import load_rows
    from ..embedded.tiny_model import ensure_tiny_model

    model_path = cfg.actor_rollout_ref.model.path or ensure_tiny_model()
    start_ray(cfg)
    tokenizer, adapter = load_model_side(cfg, model_path)
    train_rows, val_rows = load_rows(cfg, tokenizer, tool_schemas(cfg.data.tool_config_path))
    rm_path = check_inputs(cfg, train_rows + val_rows)
    teachers_refusal(cfg, train_rows)  # validation asks no teacher, as verl's
    sampler = make_sampler(cfg.data, train_rows, cfg.data.train_batch_size)
    curriculum.check(cfg, sampler)
    if sampler.steps_per_epoch() < 1:
        raise ConfigError(
            f"data.train_batch_size={cfg.data.train_batch_size} is larger than the {len(train_rows)} training prompts"
        )
    updates, total = mode.plan(cfg, sampler, len(train_rows))
    cfg = resolved(cfg, updates)
    out = run_dir(cfg)
    t = cfg.trainer
    say(
        f"model {model_path}; {len(train_rows)} prompts; {total} steps; {t.nnodes}x{t.n_gpus_per_node} workers; "
        f"rollout {cfg.actor_rollout_ref.rollout.name}"
    )
    resume_from = resume_point(cfg, out, adapter)
    kl_ctrl = core_algos.kl_controller(cfg.algorithm.kl_ctrl)
    rollout_world = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if not cfg.actor_rollout_ref.hybrid_engine else 0
    injected = faults.Injected(tuple(faults.from_env(t.nnodes * t.n_gpus_per_node, rollout_world)), out)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return Prepared(
        cfg=cfg,
        model_path=model_path,
        rm_path=rm_path,
        adapter=adapter,
        train_rows=train_rows,
        val_rows=val_rows,
        sampler=sampler,
        kl_ctrl=kl_ctrl,
        out=out,
        resume_from=resume_from,
        faults=injected,
        pad_id=pad_id,
        total=total,
        updates=updates,
    )


def ray_init_kwargs(cfg, environ=None) -> dict:
    """ray.init's arguments from ray_kwargs.ray_init, as verl's main_ppo passes them: num_cpus (not when joining a
    cluster at RAY_ADDRESS, whose size is its own) and runtime_env (env_vars, working_dir, py_executable, pip, ...),
    its unset (null) fields left out and env_vars' values as text, which Ray requires. Under full determinism verl's
    variables come first (determinism.run_env_vars), with a rollout pool of its own the weight sync's
    (weight_sync.env_vars), and the user's env_vars over them, as verl merges them."""
    init, environ = cfg.ray_kwargs.ray_init, os.environ if environ is None else environ
    kwargs: dict = {"log_to_driver": True}
    if init.num_cpus is not None and not environ.get("RAY_ADDRESS"):
        kwargs["num_cpus"] = init.num_cpus
    runtime_env = {k: v for k, v in init.runtime_env.items() if v is not None}
    env = {**determinism.run_env_vars(cfg), **weight_sync.env_vars(cfg)}
    if isinstance(runtime_env.get("env_vars"), dict):
        env.update({str(k): _env_text(v) for k, v in runtime_env["env_vars"].items()})
    if env:
        runtime_env["env_vars"] = env
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    return kwargs


def _env_text(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def start_ray(cfg) -> None:
    import ray

    ray.init(**ray_init_kwargs(cfg))


def load_model_side(cfg, model_path: str) -> tuple[object, dict | None]:
    """The tokenizer, and the LoRA adapter's shape (None without LoRA), after the checks that read the model."""
    from ..model.loading import import_external_lib, load_kwargs, load_tokenizer

    model_cfg = cfg.actor_rollout_ref.model
    import_external_lib(model_cfg)
    tokenizer = load_tokenizer(cfg, model_path)
    if cfg.actor_rollout_ref.actor.use_prefix_grouper:
        from ..model import prefix_grouper

        prefix_grouper.check(model_path, load_kwargs(model_cfg))
    adapter = lora.check(model_cfg, model_path, load_kwargs(model_cfg)) if model_cfg.uses_lora else None
    return tokenizer, adapter


def check_inputs(cfg, rows: list[dict]) -> str | None:
    """The checks on the logger, the agent loop and the rewards the rows need; the reward model's path (None:
    none)."""
    from ..agent import setup as agent_setup
    from ..reward.reward_model import check_installed, resolve_path
    from ..reward.rules import check_reward_setup

    mlflow_store.require(cfg)
    notice = agent_setup.check(cfg, rows)
    if notice:
        say(notice)
    check_reward_setup(cfg, {r["data_source"] for r in rows})
    check_installed(cfg.reward_model)
    return resolve_path(cfg.reward_model) if cfg.reward_model.enable else None


def teachers_refusal(cfg, rows: list[dict]) -> None:
    """Several distillation teachers: every training row's distillation.teacher_key value is a teacher's key
    (config/teachers.route_refusal)."""
    from ..config.teachers import route_refusal

    why = cfg.distillation.enabled and route_refusal(cfg, [r.get(cfg.distillation.teacher_key) for r in rows])
    if why:
        raise ConfigError(why)


def resolved(cfg, updates: int):
    """The config with the workers' runtime (the learning-rate schedules count updates; trainer.device=auto chose
    GPUs or CPUs), and the checks that needed that choice."""
    cfg = with_runtime(cfg, updates, "cuda" if uses_gpu(cfg) else "cpu")
    on_gpu = cfg.trainer.device == "cuda"
    why = micro_batch_refusal(cfg) if on_gpu else profiler_device_refusal(cfg) or kernel_device_refusal(cfg)
    why = why or attention_refusal(cfg)
    if why:
        raise ConfigError(why)
    notice = compiled.start_notice(cfg)
    if notice:
        say(notice)
    return cfg


def run_dir(cfg) -> Path:
    """trainer.default_local_dir, made, with a killed save's temporaries removed and the fabric report kept."""
    out = Path(cfg.trainer.default_local_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.clean_partial(str(out))
    preemption.keep_fabric_report(out)
    return out


def resume_point(cfg, out: Path, adapter: dict | None) -> Path | None:
    """The checkpoint the run resumes from (trainer.resume_mode), checked against the model and load_contents;
    None: a fresh run."""
    t, resume_from = cfg.trainer, None
    if t.resume_mode == "resume_path":
        resume_from = Path(t.resume_from_path)
    elif t.resume_mode == "auto":
        resume_from = checkpoint.latest(str(out))
    if resume_from is not None:
        ts = checkpoint.trainer_state(resume_from)
        lora.check_resume(ts.get("lora"), adapter, resume_from)
        why = checkpoint.load_refusal(resume_from, ts.get("contents", {}), checkpoint.loads(cfg))
        if why:
            raise ConfigError(why)
    return resume_from
