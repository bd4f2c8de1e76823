"""Starting the trainer's workers: their placement groups, then the workers themselves; each worker that holds the
rollout engine first asks whether it can run there (workers/start_checks.py), and the run ends at the first refusal.

The training workers hold the actor and its rollout engine, and the reference, critic and reward model unless
those have pools of their own (critic.enable_resource_pool, ...: OpenRLHF's separate nodes); each training
worker sends its samples to one worker of each such pool (round robin; the critic's pairs one to one)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config.overrides import FULLY_ASYNC
from ..errors import ConfigError
from . import placement

ROLLOUT = "rollout"  # the rollout pool's prefix (actor_rollout_ref.hybrid_engine=False): verl's top-level rollout.*


@dataclass
class Workers:
    training: list  # the training workers' Ray handles, by rank
    pools: dict[str, list] = field(default_factory=dict)  # the workers of each role in a pool of its own, by prefix

    @property
    def rollout(self) -> list:
        """The rollout pool's workers (empty where each training worker holds its engine)."""
        return self.pools.get(ROLLOUT, [])

    @property
    def critics(self) -> list:
        return self.pools.get("critic", [])

    @property
    def every(self) -> list:
        """Every worker: the training workers, then each pool's."""
        return self.training + [w for ws in self.pools.values() for w in ws]

    @property
    def ended_by_driver(self) -> list:
        """The workers the driver shuts down and ends (PoolWorker.shutdown, exit) at the end of a run: every one but
        the rollout pool's, which the mode stops (Pooled.close)."""
        return self.training + [w for prefix, ws in self.pools.items() if prefix != ROLLOUT for w in ws]


def uses_gpu(cfg) -> bool:
    """trainer.device=auto: GPUs where the cluster has them."""
    import ray

    t = cfg.trainer
    return t.device == "cuda" or (t.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


def plan_pools(cfg) -> list[placement.Pool]:
    """The training workers' pool first, then one per role with a pool of its own, in cfg.own_pools() order."""
    from ..workers.teacher import devices_per_worker

    t, rm, use_gpu = cfg.trainer, cfg.reward_model, cfg.trainer.device == "cuda"
    own = cfg.own_pools()
    resources = [
        cfg.actor_rollout_ref.placement.resource,
        cfg.critic.placement.resource if cfg.critic_in_use and "critic" not in own else None,
        rm.placement.resource if rm.enable and "reward_model" not in own else None,
        cfg.actor_rollout_ref.ref.placement.resource if cfg.ref_in_use and "actor_rollout_ref.ref" not in own else None,
        cfg.distillation.placement.resource if cfg.distillation.enabled and "distillation" not in own else None,
    ]
    labelled = sorted({n.rank for n in placement.cluster_nodes()} - {None}, key=int)
    # one group per node, pinned to the alive ranks in order unless a resource decides where workers go
    pin = len(labelled) >= t.nnodes > 1 and not any(resources)
    ranks = tuple(labelled[: t.nnodes]) if pin else ()
    pools = [placement.Pool("trainer", t.nnodes, t.n_gpus_per_node, placement.bundle(use_gpu, *resources), ranks)]
    for prefix, p in own.items():
        k = devices_per_worker(cfg) if prefix == "distillation" else 1  # a teacher engine's devices, in one bundle
        need = placement.bundle(use_gpu, p.placement.resource, gpus=k)
        pools.append(placement.Pool(prefix, p.nnodes, p.n_gpus_per_node // k, need))
    if not cfg.actor_rollout_ref.hybrid_engine:
        r = cfg.rollout
        pools.append(placement.Pool(ROLLOUT, r.nnodes, r.n_gpus_per_node, placement.bundle(use_gpu)))
    return pools


def whole_model_worker(cfg, prefix: str, model_path: str, rm_path: str | None) -> tuple[type, str | None]:
    """The worker class of a pool of its own whose workers each hold a whole model (no process group), and the path
    of that model: the reference's (the policy's), the reward model's, the distillation teacher's."""
    from ..workers.ref_worker import RefWorker
    from ..workers.reward_worker import RewardModelWorker
    from ..workers.teacher import TeacherWorker, teacher_path

    return {
        "actor_rollout_ref.ref": (RefWorker, model_path),
        "reward_model": (RewardModelWorker, rm_path),
        "distillation": (TeacherWorker, teacher_path(cfg)),
    }[prefix]


def start_workers(cfg, model_path: str, rm_path: str | None) -> Workers:
    """Every worker of the run, started. `cfg.trainer.device` is resolved (cuda or cpu). Raises ConfigError when
    a worker that holds the rollout engine is refused (workers/start_checks.py): it built nothing, and the others
    end with the run."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from ..workers import profiling
    from ..workers.critic_worker import CriticWorker
    from ..workers.group_address import node_address
    from ..workers.training_worker import Peers, TrainingWorker

    t, use_gpu, cfg_dict = cfg.trainer, cfg.trainer.device == "cuda", cfg.to_dict()
    pools = plan_pools(cfg)
    made = placement.create(pools, t.placement_timeout_s)
    nsight = profiling.nsight_runtime_env(cfg) if use_gpu else {}  # the workers' only: not the probes' tasks

    def opts(k: int, i: int) -> dict:
        """Ray options of worker i of pools[k]: its bundle's resources, in its group."""
        pool = pools[k]
        return dict(
            num_cpus=1,
            num_gpus=pool.bundle.get("GPU", 0),
            resources={r: v for r, v in pool.bundle.items() if r not in ("CPU", "GPU")},
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                made[k][i // pool.per_node], placement_group_bundle_index=i % pool.per_node
            ),
        )

    # the rollout pool is the last one (hybrid_engine=False)
    engines = 0 if cfg.actor_rollout_ref.hybrid_engine else len(pools) - 1
    side = {}
    for k, prefix in enumerate(cfg.own_pools(), start=1):
        n = pools[k].nnodes * pools[k].per_node
        if prefix == "critic":  # trained data parallel: a process group of its own
            master = ray.get(ray.remote(node_address).options(**opts(k, 0)).remote())
            actor = ray.remote(CriticWorker)
            side[prefix] = [
                actor.options(**opts(k, i), **nsight).remote(cfg_dict, i, n, master, model_path) for i in range(n)
            ]
            continue
        cls, path = whole_model_worker(cfg, prefix, model_path, rm_path)
        side[prefix] = [
            ray.remote(cls).options(**opts(k, i), **nsight).remote(cfg_dict, path, use_gpu, i) for i in range(n)
        ]
    if engines:
        from ..workers.rollout_worker import RolloutWorker

        n = pools[engines].nnodes * pools[engines].per_node
        master = ray.get(ray.remote(node_address).options(**opts(engines, 0)).remote())
        actor = ray.remote(RolloutWorker)
        if cfg.trainer.async_mode == FULLY_ASYNC and cfg.async_training.partial_rollout:
            from .fully_async import CONTROL

            # a weight sync's interrupt runs beside the generation it stops; every other call keeps its turn
            actor = ray.remote(concurrency_groups={CONTROL: 1})(RolloutWorker)
        side[ROLLOUT] = [
            actor.options(**opts(engines, i), **nsight).remote(cfg_dict, i, n, master, model_path, use_gpu)
            for i in range(n)
        ]
    world = t.nnodes * t.n_gpus_per_node
    master = ray.get(ray.remote(node_address).options(**opts(0, 0)).remote())
    pick = lambda prefix, r: side[prefix][r % len(side[prefix])] if prefix in side else None
    actor = ray.remote(TrainingWorker)
    training = []
    for r in range(world):
        peers = Peers(
            pick("reward_model", r), pick("actor_rollout_ref.ref", r), pick("critic", r), pick("distillation", r)
        )
        training.append(
            actor.options(**opts(0, r), **nsight).remote(cfg_dict, r, world, master, model_path, rm_path, peers)
        )
    workers = Workers(training, side)
    why = first_refusal(workers.every)
    if why:
        raise ConfigError(why)
    return workers


def first_refusal(workers: list) -> str | None:
    """The first refusal a worker reports (PoolWorker.refusal), or None once every worker has started. A refused
    worker answers at once, while the others may wait on it in a collective until killed, so the answers are read
    as they come, not in order."""
    import ray

    pending = [w.refusal.remote() for w in workers]
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        why = ray.get(done[0])
        if why:
            return why
    return None


def where(workers) -> str:
    """`ip x count, ...` in the workers' order of first appearance."""
    import ray

    ips = ray.get([w.node_ip.remote() for w in workers])
    return ", ".join(f"{ip} x{ips.count(ip)}" if ips.count(ip) > 1 else ip for ip in dict.fromkeys(ips))


def describe_placement(cfg, workers: Workers, rm_path: str | None) -> str:
    """Which roles run where: the colocated ones with the training workers, then each pool of its own."""
    side = workers.pools
    colocated = [
        name
        for name, here in (
            ("ref", cfg.ref_in_use and "actor_rollout_ref.ref" not in side),
            ("critic", cfg.critic_in_use and "critic" not in side),
            (f"reward_model ({rm_path})", rm_path and "reward_model" not in side),
            ("distillation teacher", cfg.distillation.enabled and "distillation" not in side),
        )
        if here
    ]
    pools = "".join(
        f"; {prefix}{f' ({rm_path})' if prefix == 'reward_model' else ''} on {where(ws)}" for prefix, ws in side.items()
    )
    ep = cfg.actor_rollout_ref.actor.fsdp_config.expert_parallel_size
    experts = f" (the actor's experts split over rows of {ep} workers)" if ep > 1 else ""
    roles = f"actor_rollout_ref{experts}{''.join(' + ' + c for c in colocated)}"
    return f"placement: {roles} on {where(workers.training)}{pools}"
