"""What the workers of the trainer's pools share. Every worker is a Ray actor on one device of a placement
group's bundle; the data-parallel ones (training workers, the critic's own pool) are also ranks of a
torch.distributed group, and cut their rows into the micro batches all ranks agree on. The critic's value
pass and its update are here because a training worker runs them when the critic is colocated and a critic
worker runs them when it has a pool of its own."""

from __future__ import annotations

import contextlib
import gc
import os
import random
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from .. import determinism
from ..batch.step_batch import StepBatch
from ..config.schema import Config, from_dict
from ..devices import gpu_index
from ..model import lr_schedule, parallel, precision, ulysses
from ..model import micro_batches as batching
from ..model.build import Trainable
from ..model.forward import in_micro_batches, token_logprobs
from ..model.forward import values as critic_values
from ..rollout.engines.base import GROUP_ENV
from . import profiling
from .phase_report import install_stack_dump
from .ppo_update import mean_stats, update_critic

# how long a worker's end waits for its resource tracker to unlink what its engines' processes left
# (process_exit.end_resource_tracker): the tracker ends at once when they have
RESOURCE_TRACKER_WAIT_S = 10.0


def ensure_local_embedded_model(path: str) -> None:
    """The embedded models (policy, reward model) are built where they are used (deterministic; DDP then
    broadcasts rank 0's weights), so a node without the head's filesystem, e.g. a second container, still has
    them. It must run before torch.distributed starts: transformers' save_pretrained then writes only on rank 0,
    and another rank's node would get the tokenizer without the model (seen with compose)."""
    from ..embedded.tiny_model import cache_dir, ensure_tiny_model
    from ..embedded.tiny_reward_model import ensure_tiny_reward_model, rm_cache_dir

    builders = {str(cache_dir()): ensure_tiny_model, str(rm_cache_dir()): ensure_tiny_reward_model}
    if not os.path.exists(path) and os.path.abspath(path) in builders:
        builders[os.path.abspath(path)]()


def single_device(use_gpu: bool) -> torch.device:
    """The device of a worker that holds a whole model and joins no process group (reference, reward model)."""
    torch.set_num_threads(1)
    return torch.device("cuda", gpu_index()) if use_gpu else torch.device("cpu")


def engine_seed(cfg: Config, replica: int, own: int) -> int:
    """The seed of rollout engine number `replica`: verl's rollout.seed + replica where rollout.seed is given, else
    `own`, the caller's seed drawn from trainer.seed."""
    seed = cfg.actor_rollout_ref.rollout.seed
    return own if seed is None else seed + replica


@contextlib.contextmanager
def forked_rngs(device: torch.device):
    """Random draws inside leave every global stream as it was: torch's (CPU and this GPU), NumPy's and Python's.
    The ranks of one tensor-parallel engine must sample the same tokens, and vLLM draws each unseeded request's
    seed from NumPy's global stream (its V2 model runner) and samples with torch's: whatever else a rank draws
    between two rollouts (dropout in the update) must not move them."""
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            yield
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)


def start_rank(
    cfg: Config,
    rank: int,
    world: int,
    master: tuple[str, int],
    model_paths: list[str | None],
    deterministic: bool = False,
) -> torch.device:
    """Seeds, this rank's device, the embedded models it needs, and its process group (Gloo on CPU, NCCL on GPU).
    deterministic: verl's full determinism in this process (determinism.enable), before CUDA or NCCL start."""
    seed = cfg.trainer.seed + rank
    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    if deterministic:
        determinism.enable(seed)
    torch.set_num_threads(1)
    dev, device = cfg.trainer.device, torch.device("cpu")
    if dev == "cuda" or (dev == "auto" and torch.cuda.is_available()):
        device = torch.device("cuda", gpu_index())
        torch.cuda.set_device(device)
        precision.allow_tf32()
    determinism.engine_env(cfg, device.type)
    for path in model_paths:
        if path:
            ensure_local_embedded_model(path)  # before the process group: see there
    join_group(device, master, rank, world, collective_timeout(cfg.actor_rollout_ref.nccl_timeout))
    return device


def join_group(device: torch.device, master: tuple[str, int], rank: int, world: int, timeout: timedelta) -> None:
    """This process's default group (Gloo on CPU, NCCL on GPU), met at `master`, rank 0's store; its address is
    left in GROUP_ENV: the same on every rank of the group, and while the group lives no other group on the host has
    it (the store holds the port), so what the ranks make together on the host can be named after it."""
    os.environ[GROUP_ENV] = f"{master[0]}:{master[1]}"
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo",
        init_method=f"tcp://{master[0]}:{master[1]}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )


def collective_timeout(seconds: float) -> timedelta:
    """verl's nccl_timeout for this process's every group: the default one, and those made later (sequence
    parallel, the engines' tensor-parallel groups, HSDP's device mesh), which torch would otherwise give its
    built-in defaults (10 min NCCL, 30 min Gloo) since new_group and init_device_mesh read these module defaults.
    A collective a peer never joins then raises on the waiting ranks after `seconds` (on GPUs through NCCL's async
    error handling, on unless TORCH_NCCL_ASYNC_ERROR_HANDLING=0), after the head's watchdog has named the peer."""
    from torch.distributed import distributed_c10d as c10d

    t = timedelta(seconds=seconds)
    c10d.default_pg_timeout = t
    if isinstance(c10d.default_pg_nccl_timeout, timedelta):  # None where torch was built without NCCL
        c10d.default_pg_nccl_timeout = t
    return t


def whole_model_logprobs(model, precision, forward, device, batch: StepBatch, micro: int, budget) -> torch.Tensor:
    """[B, R] log-probs of the response tokens by a whole (unsharded) model on `device`, in micro batches of at most
    `micro` rows, or of `budget` tokens where one is set, on the CPU for the trip back. The whole model is in this
    process, so the micro batches need no agreement with other workers (a pool's reference or teacher)."""
    ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
    lengths = mask.sum(-1).tolist() if budget else []
    parts = batching.plan(lengths, 0, len(ids), micro, budget, lambda k: k)

    def part(p):
        with precision.autocast():
            return token_logprobs(model, ids[p], mask[p], batch.prompt_len, forward)[0]

    return in_micro_batches(parts, part).cpu()


class PoolWorker:
    profiler = profiling.OFF  # a worker that holds a profiled role sets its own (profiling.worker_profiler)
    # why this worker could not start, in one line (workers/start_checks.py), set by the constructor of a worker that
    # holds the rollout engine, which then builds nothing; None: it started
    refused: str | None = None

    def refusal(self) -> str | None:
        """Why this worker could not start, or None once it has: the driver's first call to every worker, which it
        answers as soon as its constructor has returned (driver/launch.py first_refusal)."""
        return self.refused

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def whereabouts(self) -> dict:
        """Where this worker's process is, for the watchdog's stack dumps (driver/stacks.py), which it readies."""
        import ray

        install_stack_dump()
        ctx = ray.get_runtime_context()
        return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(), "pid": os.getpid()}

    # the driver's calls around the steps of global_profiler.steps (profiling.StepWindows)
    def start_profile(self, step: int) -> None:
        self.profiler.start(step)

    def stop_profile(self) -> None:
        self.profiler.stop()

    def after_update(self, step: int) -> None:
        self.profiler.after_update(step)

    def shutdown(self) -> None:
        """Releases what this worker holds beyond its process (an engine's child process, a process group) before
        exit(); the driver calls it on every worker at the end of a run. A worker that holds nothing such keeps this."""

    def exit(self) -> None:
        """This process ends normally, its exit handlers run: they free what an engine holds beyond the process (vLLM's
        CPU engines spanning workers: their shared-memory segments, which the next such engine on the node cannot
        start beside; the message queues of vLLM's worker processes, which this process's resource tracker unlinks),
        which a kill at the end of the job would leave behind. Call it after shutdown()."""
        import ray

        from ..process_exit import end_resource_tracker

        end_resource_tracker(RESOURCE_TRACKER_WAIT_S)
        ray.actor.exit_actor()


class RankWorker(PoolWorker):
    """A rank of a data-parallel group: its config, device and process group, and micro batches every rank agrees
    on (each forward and backward is a collective under FSDP or DDP, so all ranks must run as many)."""

    holds_models: tuple[str, ...] = ()  # the attributes that hold DDP/FSDP-wrapped models, released at shutdown

    def __init__(self, cfg_dict: dict, rank: int, world: int, master: tuple[str, int], model_paths: list[str | None]):
        self.cfg = from_dict(cfg_dict)
        self.rank, self.world = rank, world
        deterministic = determinism.asked(self.cfg, self.roles())
        self.device = start_rank(self.cfg, rank, world, master, model_paths, deterministic)
        self.budgets = batching.token_budgets(self.cfg)
        self.mini = batching.per_worker_mini_batch(self.cfg, world)
        self.critic_mini = batching.per_worker_mini_batch(self.cfg, world, "critic")
        # each role's sequence-parallel group (model/ulysses.py), None where its sequences are not split
        self.sp: dict[str, ulysses.SeqParallel | None] = {"actor": None, "ref": None, "critic": None}

    def roles(self) -> tuple[str, ...]:
        """The roles this process holds (determinism.ROLE_SECTIONS' names), read before it starts: self.cfg is set."""
        return ()

    def _agree_max(self, k: int) -> int:
        t = torch.tensor([k], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _micro_batches(self, batch: StepBatch, micro: int | None, budget_key: str, rows: range | None = None) -> list:
        """Micro batches of `rows` (default: all): `micro` rows each, or by the pass's token budget
        (use_dynamic_bsz)."""
        rows = rows or range(len(batch))
        return batching.rows(
            batch.attention_mask, rows.start, rows.stop, micro, self.budgets[budget_key], self._agree_max
        )

    def _mini_batches(
        self, batch: StepBatch, micro: int | None, budget_key: str, mini: int | None = None
    ) -> batching.MiniBatches:
        """The update's mini batches (one optimizer step each, `mini` rows; default: the actor's) as their micro
        batches."""
        mini, n = mini or self.mini, len(batch)
        micro = min(micro or mini, mini)
        parts = [self._micro_batches(batch, micro, budget_key, range(s, min(s + mini, n))) for s in range(0, n, mini)]
        return batching.MiniBatches(parts, mini)

    def _values(self, critic: Trainable, batch: StepBatch) -> torch.Tensor:
        """The critic's value of each response position ([B, R]), in its forward micro batches."""
        c = self.cfg.critic

        def part(sl):
            with critic.precision.autocast():
                ids, mask = batch.input_ids[sl], batch.attention_mask[sl]
                return critic_values(
                    critic.module, ids, mask, batch.prompt_len, c.model.use_remove_padding, self.sp["critic"]
                )

        micro = c.forward_micro_batch_size_per_gpu or c.ppo_micro_batch_size_per_gpu
        return in_micro_batches(self._micro_batches(batch, micro, "critic.forward_max_token_len_per_gpu"), part)

    def _update_critic(self, critic: Trainable, batch: StepBatch, global_step: int) -> dict:
        """The critic's update at its scheduled learning rate; `batch` carries values and returns."""
        c = self.cfg.critic
        lr = lr_schedule.lr_at(c.optim, global_step - 1, self.cfg.trainer.total_training_steps)
        lr_schedule.apply(critic.opt, lr)
        plan = self._mini_batches(
            batch, c.ppo_micro_batch_size_per_gpu, "critic.ppo_max_token_len_per_gpu", self.critic_mini
        )
        return {"critic/lr": lr, **mean_stats(update_critic(critic, batch, self.cfg, plan, self.sp["critic"]))}

    def release_models(self) -> None:
        """The models dropped, their reference cycles collected and the meshes forgotten, while the process group is
        still there: DDP's reducer holds a reference to the group, and freed after the group was destroyed, the Gloo
        group's destructor can deadlock (torch 2.13)."""
        for name in self.holds_models:
            setattr(self, name, None)
        gc.collect()
        parallel.forget_meshes()

    def shutdown(self) -> None:
        self.release_models()
        if dist.is_initialized():
            dist.destroy_process_group()
