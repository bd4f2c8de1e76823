"""The PPO/GRPO driver: `rlrig train KEY=VALUE ...` runs this on the head under the Ray cluster."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

from rlrig.trainer import metrics as M
from rlrig.trainer.config.presets import with_preset
from rlrig.trainer.config.schema import ConfigError, parse_overrides
from rlrig.trainer.driver import checkpoint, placement, preemption
from rlrig.trainer.model import lora


def say(msg: str) -> None:
    print(f"rlrig.train: {msg}", file=sys.stderr, flush=True)


class Sampler:
    """Epoch-shuffled prompt order with a position that checkpoints can restore."""

    def __init__(self, n: int, batch: int, seed: int, shuffle: bool):
        self.n, self.batch, self.seed, self.shuffle = n, batch, seed, shuffle
        self.epoch, self.pos = 0, 0

    def order(self) -> list[int]:
        idx = list(range(self.n))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(idx)
        return idx

    def next(self) -> list[int]:
        if self.pos + self.batch > self.n:
            self.epoch, self.pos = self.epoch + 1, 0
        out = self.order()[self.pos : self.pos + self.batch]
        self.pos += self.batch
        return out

    def steps_per_epoch(self) -> int:
        return self.n // self.batch


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


def load_rows(cfg, tokenizer) -> tuple[list[dict], list[dict]]:
    from rlrig.trainer.data.datasets import arithmetic_rows, load_dataset, tokenize_prompts

    d = cfg.data
    train = load_dataset(d.train_files) if d.train_files else arithmetic_rows(2048, "train", seed=d.seed)
    val = (
        load_dataset(d.val_files)
        if d.val_files
        else (arithmetic_rows(128, "test", seed=d.seed + 1) if not d.train_files else [])
    )
    tok = lambda rows: tokenize_prompts(
        rows,
        tokenizer,
        d.max_prompt_length,
        d.truncation,
        d.filter_overlong_prompts,
        d.prompt_key,
        d.apply_chat_template_kwargs,
    )
    return tok(train), (tok(val) if val else [])


def make_workers(cfg, model_path: str, rm_path: str | None):
    """The training workers (actor, rollout, reference and critic colocated, as verl's hybrid engine) and the
    workers of the roles in pools of their own (the critic, the reference, the reward model); each training worker
    sends its samples to one worker of each such pool (round robin; the critic's pairs one to one), or runs that
    model itself."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rlrig.trainer.workers.critic_worker import CriticWorker
    from rlrig.trainer.workers.ref_worker import RefWorker
    from rlrig.trainer.workers.reward_worker import RewardModelWorker
    from rlrig.trainer.workers.training_worker import Worker, node_address

    t, rm = cfg.trainer, cfg.reward_model
    use_gpu = t.device == "cuda" or (t.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)
    cfg.trainer.device = "cuda" if use_gpu else "cpu"
    own = cfg.own_pools()
    resources = [
        cfg.actor_rollout_ref.placement.resource,
        cfg.critic.placement.resource if cfg.critic_in_use and "critic" not in own else None,
        rm.placement.resource if rm.enable and "reward_model" not in own else None,
        cfg.actor_rollout_ref.ref.placement.resource if cfg.ref_in_use and "actor_rollout_ref.ref" not in own else None,
    ]
    labelled = {n.rank for n in placement.cluster_nodes()} - {None}
    # one group per node, pinned to the node of the same rank unless a resource decides where workers go
    pin = len(labelled) >= t.nnodes > 1 and not any(resources)
    pools = [placement.Pool("trainer", t.nnodes, t.n_gpus_per_node, placement.bundle(use_gpu, *resources), pin)]
    pools += [
        placement.Pool(prefix, p.nnodes, p.n_gpus_per_node, placement.bundle(use_gpu, p.placement.resource))
        for prefix, p in own.items()
    ]
    made = placement.create(pools, t.placement_timeout_s)

    def opts(k: int, i: int) -> dict:
        """Ray options of worker i of pools[k]: its bundle's resources, in its group."""
        pool = pools[k]
        return dict(
            num_cpus=1,
            num_gpus=1 if use_gpu else 0,
            resources={r: v for r, v in pool.bundle.items() if r not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                made[k][i // pool.per_node], placement_group_bundle_index=i % pool.per_node
            ),
        )

    classes = {"actor_rollout_ref.ref": (RefWorker, model_path), "reward_model": (RewardModelWorker, rm_path)}
    side = {}
    for k, prefix in enumerate(own, start=1):
        n = pools[k].nnodes * pools[k].per_node
        if prefix == "critic":  # trained data parallel: a process group of its own
            master = ray.get(ray.remote(node_address).options(**opts(k, 0)).remote())
            side[prefix] = [
                ray.remote(CriticWorker).options(**opts(k, i)).remote(cfg.to_dict(), i, n, master, model_path)
                for i in range(n)
            ]
            continue
        cls, path = classes[prefix]
        side[prefix] = [ray.remote(cls).options(**opts(k, i)).remote(cfg.to_dict(), path, use_gpu) for i in range(n)]
    world = t.nnodes * t.n_gpus_per_node
    master = ray.get(ray.remote(node_address).options(**opts(0, 0)).remote())
    pick = lambda prefix, r: side[prefix][r % len(side[prefix])] if prefix in side else None
    workers = [
        ray.remote(Worker)
        .options(**opts(0, r))
        .remote(
            cfg.to_dict(),
            r,
            world,
            master,
            model_path,
            rm_path,
            pick("reward_model", r),
            pick("actor_rollout_ref.ref", r),
            pick("critic", r),
        )
        for r in range(world)
    ]
    return workers, side


def where(workers) -> str:
    """`ip x count, ...` in the workers' order of first appearance."""
    import ray

    ips = ray.get([w.node_ip.remote() for w in workers])
    return ", ".join(f"{ip} x{ips.count(ip)}" if ips.count(ip) > 1 else ip for ip in dict.fromkeys(ips))


def shard(rows: list, parts: int) -> list[list]:
    size = len(rows) // parts
    return [rows[i * size : (i + 1) * size] for i in range(parts)]


def val_parts(rows: list, workers: int) -> tuple[list[list], list[bool]]:
    """Each worker's validation prompts, and which are fillers: a worker left without any gets the first prompt
    again, its result dropped, since an engine spanning workers (tensor parallel) generates or scores only when all
    of its workers ask, and a worker left out would leave the others waiting."""
    parts = spread(rows, workers)
    return [p or rows[:1] for p in parts], [not p for p in parts]


def spread(rows: list, parts: int) -> list[list]:
    """Every row, in order, over `parts` lists as evenly as possible (validation keeps every prompt)."""
    size, extra = divmod(len(rows), parts)
    bounds = [i * size + min(i, extra) for i in range(parts + 1)]
    return [rows[bounds[i] : bounds[i + 1]] for i in range(parts)]


def validate_rows(workers, val_rows, cfg, step: int = 0, out: Path | None = None) -> dict:
    """Validation with rollout.val_kwargs (n samples a prompt), data.val_batch_size prompts at a time (None: all
    at once) spread over the workers: verl's val-core/val-aux metrics (driver/val_metrics.py). trainer.log_val_generations
    samples are printed and appended to val_generations.jsonl."""
    import ray

    from rlrig.trainer.driver.val_metrics import validation_metrics

    if not val_rows:
        return {}
    n = cfg.actor_rollout_ref.rollout.val_kwargs.n
    prompts: list[tuple[str, list[dict]]] = []  # (data source, each sample's variables)
    shown = []
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
    if shown:
        for g in shown:
            say(f"validation sample (step {step}, score {g['score']}): {g['response']!r}")
        if out is not None:
            with open(out / "val_generations.jsonl", "a") as f:
                f.writelines(json.dumps(g, default=str) + "\n" for g in shown)
    return m


def update_kl_controller(kl_ctrl, m: dict, cfg) -> None:
    """After a step with KL in the reward: adapt the coefficient by the batch's number of samples
    (prompts x n, as verl passes it), and log it."""
    if "actor/reward_kl_penalty" in m:
        kl_ctrl.update(m["actor/reward_kl_penalty"], cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n)
        m["actor/reward_kl_penalty_coeff"] = kl_ctrl.value


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


def train(cfg) -> int:
    import ray

    from rlrig.trainer.algos import core_algos
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.reward.reward_model import check_installed, resolve_path
    from rlrig.trainer.reward.rules import check_reward_setup

    model_path = cfg.actor_rollout_ref.model.path or ensure_tiny_model()
    if cfg.ray_kwargs.ray_init.num_cpus is not None and not os.environ.get("RAY_ADDRESS"):
        ray.init(num_cpus=cfg.ray_kwargs.ray_init.num_cpus)
    else:
        ray.init(log_to_driver=True)
    from rlrig.trainer.model.build import import_external_lib, load_kwargs, load_tokenizer

    import_external_lib(cfg.actor_rollout_ref.model)
    tokenizer = load_tokenizer(cfg, model_path)
    if cfg.actor_rollout_ref.actor.use_prefix_grouper:
        from rlrig.trainer.model import prefix_grouper

        prefix_grouper.check(model_path, load_kwargs(cfg.actor_rollout_ref.model))
    adapter = (
        lora.check(cfg.actor_rollout_ref.model, model_path, load_kwargs(cfg.actor_rollout_ref.model))
        if cfg.actor_rollout_ref.model.uses_lora
        else None
    )
    train_rows, val_rows = load_rows(cfg, tokenizer)
    check_reward_setup(cfg, {r["data_source"] for r in train_rows + val_rows})
    check_installed(cfg.reward_model)
    rm_path = resolve_path(cfg.reward_model) if cfg.reward_model.enable else None
    t = cfg.trainer
    sampler = Sampler(len(train_rows), cfg.data.train_batch_size, cfg.data.seed, cfg.data.shuffle)
    if sampler.steps_per_epoch() < 1:
        raise ConfigError(
            f"data.train_batch_size={cfg.data.train_batch_size} is larger than the {len(train_rows)} training prompts"
        )
    total = t.total_training_steps or sampler.steps_per_epoch() * t.total_epochs
    t.total_training_steps = total  # the workers' learning-rate schedules need it (verl injects it the same way)
    out = Path(t.default_local_dir)
    out.mkdir(parents=True, exist_ok=True)
    checkpoint.clean_partial(str(out))
    preemption.keep_fabric_report(out)
    kl_ctrl = core_algos.kl_controller(cfg.algorithm.kl_ctrl)
    say(
        f"model {model_path}; {len(train_rows)} prompts; {total} steps; {t.nnodes}x{t.n_gpus_per_node} workers; rollout {cfg.actor_rollout_ref.rollout.name}"
    )
    resume = None
    if t.resume_mode == "resume_path":
        resume = Path(t.resume_from_path)
    elif t.resume_mode == "auto":
        resume = checkpoint.latest(str(out))
    if resume is not None:
        lora.check_resume(checkpoint.trainer_state(resume).get("lora"), adapter, resume)
    workers, side = make_workers(cfg, model_path, rm_path)
    critics = side.get("critic", [])
    say("workers on " + ", ".join(ray.get([w.node_ip.remote() for w in workers])))
    colocated = [
        name
        for name, here in (
            ("ref", cfg.ref_in_use and "actor_rollout_ref.ref" not in side),
            ("critic", cfg.critic_in_use and "critic" not in side),
            (f"reward_model ({rm_path})", rm_path and "reward_model" not in side),
        )
        if here
    ]
    say(
        f"placement: actor_rollout_ref{''.join(' + ' + c for c in colocated)} on {where(workers)}"
        + "".join(
            f"; {prefix}{f' ({rm_path})' if prefix == 'reward_model' else ''} on {where(ws)}"
            for prefix, ws in side.items()
        )
    )
    engines = ray.get([w.engine_name.remote() for w in workers])
    errors = [err for _, err in engines if err]
    if errors:
        raise ConfigError(errors[0])
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is and any(name == "hf" for name, _ in engines):  # rollout.name=auto found no vLLM or SGLang
        raise ConfigError(
            f"algorithm.rollout_correction.rollout_is={rc.rollout_is} weighs by the engine's own log-probs, "
            "and this run's engine is hf, which computes none; install vLLM or SGLang and set "
            "actor_rollout_ref.rollout.name to it"
        )
    say(f"rollout engine: {', '.join(sorted({name for name, _ in engines}))}")
    step = 0
    if resume is not None:
        state, rngs, ts = checkpoint.load(resume)
        ray.get(
            [w.load.remote(state, rngs[i] if i < len(rngs) else None) for i, w in enumerate(workers)]
            + [c.load.remote(state) for c in critics]
        )
        step, sampler.epoch, sampler.pos, kl_ctrl.value = ts["global_step"], ts["epoch"], ts["pos"], ts["kl_coef"]
        dropped = preemption.truncate_metrics(out / "metrics.jsonl", step)
        say(
            f"resumed from {resume} at step {step}"
            + (f" (dropped {dropped} logged steps after it)" if dropped else "")
            + (f"; restart {preemption.restarts()} in place" if preemption.restarts() else "")
        )
    elif (out / "metrics.jsonl").exists():
        (out / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
    log = MetricsLog(cfg, out / "metrics.jsonl")
    if (t.val_before_train and step == 0 or t.val_only) and val_rows:
        m = validate_rows(workers, val_rows, cfg, step, out)
        say(f"validation at step {step}: {m}")
        log.log(step, {"training/global_step": step, **m})
    if t.val_only:
        ray.get([w.shutdown.remote() for w in workers + critics])
        say(f"trainer.val_only: validated, not trained; metrics in {out / 'metrics.jsonl'}")
        return 0
    started, first = time.monotonic(), step + 1
    stop, saved_at = preemption.StopRequest(), None
    save = lambda at: save_checkpoint(
        workers, critics, out, at, sampler, kl_ctrl, model_path, cfg.actor_rollout_ref.model.gguf_file, adapter
    )
    while step < total and stop.signum is None:
        step += 1
        t0 = time.perf_counter()
        batch = [train_rows[i] for i in sampler.next()]
        results = ray.get([w.step.remote(p, kl_ctrl.value, step) for w, p in zip(workers, shard(batch, len(workers)))])
        m = M.reduce(results)
        update_kl_controller(kl_ctrl, m, cfg)
        if t.test_freq > 0 and (step % t.test_freq == 0 or step == total):
            tv = time.perf_counter()
            m.update(validate_rows(workers, val_rows, cfg, step, out))
            m["timing_s/testing"] = time.perf_counter() - tv
        if t.save_freq > 0 and (step % t.save_freq == 0 or step == total):
            ts0 = time.perf_counter()
            save(step)
            saved_at = step
            m["timing_s/save_checkpoint"] = time.perf_counter() - ts0
        dt = time.perf_counter() - t0
        m.update(
            {
                "training/global_step": step,
                "training/epoch": sampler.epoch,
                "training/restarts": preemption.restarts(),
                "timing_s/step": dt,
                "perf/time_per_step": dt,
                "perf/throughput": m["perf/total_num_tokens"] / (dt * len(workers)),
                "perf/cpu_memory_used_gb": _rss_gb(),
            }
        )
        log.log(step, m)
        progress(step, total, m, started, first)
    if stop.signum is not None and saved_at != step:
        save(step)
    ray.get([w.shutdown.remote() for w in workers + critics])
    if cfg.ray_kwargs.timeline_json_file:
        ray.timeline(filename=cfg.ray_kwargs.timeline_json_file)
    if stop.signum is not None:
        say(f"stopped by signal after step {step}, checkpoint written; a relaunch resumes at step {step + 1}")
        return stop.exit_code
    say(f"done: {step} steps; metrics in {out / 'metrics.jsonl'}")
    return 0


def save_checkpoint(
    workers,
    critics,
    out: Path,
    step: int,
    sampler: Sampler,
    kl_ctrl,
    model_path: str,
    gguf_file: str,
    adapter: dict | None,
) -> None:
    """`critics`: the critic's own workers, if it has a pool of its own; their state joins the training workers'.
    `adapter`: the LoRA adapter's shape (lora.check), which a resume must match and `rlrig export` rebuilds."""
    import ray

    state = ray.get([w.state.remote() for w in workers])[0]  # under FSDP gathering the state is a collective
    if critics:
        state.update(ray.get([c.state.remote() for c in critics])[0])
    rngs = ray.get([w.rng_state.remote() for w in workers])
    checkpoint.save(
        str(out),
        step,
        state,
        rngs,
        {
            "global_step": step,
            "epoch": sampler.epoch,
            "pos": sampler.pos,
            "kl_coef": kl_ctrl.value,
            "model_path": model_path,
            "gguf_file": gguf_file,
            "lora": adapter,
        },
    )


def _rss_gb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 1024**3


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="rlrig train")
    parser.add_argument("--print-config", action="store_true")
    parser.add_argument("--preset")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    try:
        cfg = parse_overrides(with_preset(args.preset, args.overrides))
        if args.print_config:
            print(json.dumps(cfg.described(), indent=2))
            return 0
        return train(cfg)
    except ConfigError as e:  # bad input, found where it was read; anything else is a bug and shows its traceback
        print(f"rlrig: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
