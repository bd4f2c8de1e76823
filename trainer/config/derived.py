"""Keys verl derives from others before its workers read them: the deprecated global micro batches, which verl
divides by the role's GPU count into the per-GPU keys (verl fsdp_workers.py:247-273 for the actor, rollout and
reference, 1233-1242 for the critic); a global key that is set wins over its per-GPU key there, as here.
And `actor_rollout_ref.model.torch_dtype`, the load dtype of the two models built from actor_rollout_ref.model; and
each role's Ulysses size from its two keys."""

from __future__ import annotations

from ..errors import ConfigError
from ..model.precision import DTYPES
from .domains import value_at
from .schema import Config

# (section, verl's global key, the per-GPU key it sets, the role's own pool if it may have one)
GLOBAL_MICRO_BATCHES = (
    ("actor_rollout_ref.actor", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", None),
    ("actor_rollout_ref.rollout", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", None),
    ("actor_rollout_ref.ref", "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", "ref"),
    ("critic", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "critic"),
    ("critic", "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", "critic"),
)


def role_gpus(cfg: Config, pool: str | None) -> int:
    """The GPUs (CPU worker slots) the role's passes are spread over: its own pool's, else the training workers'."""
    own = {"ref": cfg.actor_rollout_ref.ref, "critic": cfg.critic}.get(pool)
    if own is not None and own.enable_resource_pool:
        return own.nnodes * own.n_gpus_per_node
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def model_load_dtype(cfg: Config) -> None:
    """model.torch_dtype fills the actor's and reference's fsdp_config.model_dtype; one set otherwise is refused
    rather than either silently winning."""
    a = cfg.actor_rollout_ref
    dtype = a.model.torch_dtype
    if dtype is None:
        return
    if dtype not in DTYPES:
        raise ConfigError(f"actor_rollout_ref.model.torch_dtype={dtype!r}: choose one of {', '.join(DTYPES)}")
    for role in ("actor", "ref"):
        fc = getattr(a, role).fsdp_config
        if fc.model_dtype is not None and DTYPES.get(fc.model_dtype) != DTYPES[dtype]:
            raise ConfigError(
                f"actor_rollout_ref.model.torch_dtype={dtype} and actor_rollout_ref.{role}.fsdp_config.model_dtype="
                f"{fc.model_dtype} both set the {role}'s weight dtype; keep one"
            )
        fc.model_dtype = dtype


def actor_fused_kernels(cfg: Config) -> None:
    """actor.use_fused_kernels is verl's ${oc.select:actor_rollout_ref.model.use_fused_kernels,false}, which none of
    its workers read (its engines read the model's): unset, it takes the model's; another value is refused rather
    than ignored."""
    a = cfg.actor_rollout_ref
    if a.actor.use_fused_kernels is None:
        a.actor.use_fused_kernels = a.model.use_fused_kernels
    elif a.actor.use_fused_kernels != a.model.use_fused_kernels:
        raise ConfigError(
            f"actor_rollout_ref.actor.use_fused_kernels={a.actor.use_fused_kernels} with "
            f"actor_rollout_ref.model.use_fused_kernels={a.model.use_fused_kernels}: verl's workers read only the "
            "model's key; set actor_rollout_ref.model.use_fused_kernels (and drop the actor's)"
        )


# torch.Generator().initial_seed(): verl shuffles with a torch.Generator it seeds only where data.seed is given, so
# data.seed=null gives every run the same order, drawn from this seed
TORCH_DEFAULT_SEED = 67280421310721


def ulysses_sizes(cfg: Config) -> None:
    """verl 0.9's engine splits sequences by the role's fsdp_config.ulysses_sequence_parallel_size; the role's own key
    (deprecated there), when above 1, is copied over it (FSDPActorConfig.__post_init__). The reference's own key is
    the actor's own by default (`${oc.select:actor_rollout_ref.actor.ulysses_sequence_parallel_size,1}`), so an
    actor split only by its fsdp_config leaves the reference unsplit unless the reference's fsdp_config says so.
    The critic's own key (read by verl's legacy workers, 0.7) is taken the same way beside its fsdp's."""
    a = cfg.actor_rollout_ref
    actor_own = a.actor.ulysses_sequence_parallel_size
    ref_own = actor_own if a.ref.ulysses_sequence_parallel_size is None else a.ref.ulysses_sequence_parallel_size
    for role, own, engine in (
        (a.actor, actor_own, a.actor.fsdp_config),
        (a.ref, ref_own, a.ref.fsdp_config),
        (cfg.critic, cfg.critic.ulysses_sequence_parallel_size, cfg.critic.model.fsdp_config),
    ):
        # a value below 1 stays for the domain check to refuse
        role.ulysses_sequence_parallel_size = engine.ulysses_sequence_parallel_size if own == 1 else own


def derive(cfg: Config) -> None:
    model_load_dtype(cfg)
    ulysses_sizes(cfg)
    if cfg.data.seed is None:
        cfg.data.seed = TORCH_DEFAULT_SEED
    actor_fused_kernels(cfg)
    if cfg.data.tool_config_path is None:  # verl: ${oc.select:actor_rollout_ref.rollout.multi_turn.tool_config_path}
        cfg.data.tool_config_path = cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path
    for section, key, per_gpu, pool in GLOBAL_MICRO_BATCHES:
        obj = value_at(cfg, section)
        total = getattr(obj, key)
        if total is None:
            continue
        gpus = role_gpus(cfg, pool)
        if total < gpus:
            raise ConfigError(
                f"{section}.{key}={total} is a micro batch over all {gpus} GPUs (verl divides it by their number), "
                f"which leaves none per GPU; set it to at least {gpus}, or set {section}.{per_gpu}"
            )
        setattr(obj, per_gpu, total // gpus)
