"""Config validation, section by section: every check reads the config and raises ConfigError in one line
naming the key, its value and the fix; nothing here changes the config."""

from __future__ import annotations

import math

from ..algos import rollout_correction
from ..algos.bypass_loss import LOSS_TYPES
from ..algos.core_algos import LOSS_AGG_MODES
from ..algos.estimators import ESTIMATORS
from ..algos.policy_losses import POLICY_LOSSES
from ..errors import ConfigError
from ..model import attention, compiled, kernels
from ..model.micro_batches import (
    mini_batch_prompts,
    per_worker_mini_batch,
    sequence_parallel,
    shares_by_sample,
    token_budgets,
)
from ..profiler_settings import ROLE_KEYS, ROLLOUT_KEY, TOOL_RECORDS_CPU, TORCH_CONTENTS, role_profile, rollout_profile
from ..reward.managers import check_name, overlong
from ..rollout.engines import ENGINES
from ..rollout.engines import NAMES as ENGINE_NAMES
from .algorithm_checks import validate_algorithm_keys
from .distillation_checks import validate_distillation
from .domains import DOMAINS, value_at
from .schema import (
    CHECKPOINT_CONTENTS,
    FUSED_BACKENDS,
    SANITY_CHECK_MODES,
    WATCHDOG_MARGIN_S,
    Config,
    FsdpConfig,
    RewardModelRolloutConfig,
    canonical_strategy,
)

LOGGERS = ("console", "tensorboard", "wandb", "mlflow", "file")
_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS = (*_KL, *(k + "+" for k in _KL))  # "+": the value of the kind, the gradient of k2
DTYPES = (
    "fp32",
    "bf16",
    "float32",
    "bfloat16",
)  # verl's spellings both; fp16 compute would need loss scaling, which rlrig does not do


RAY_RESERVED = ("CPU", "GPU", "memory", "object_store_memory")


def fsdp_configs(cfg: Config) -> dict[str, FsdpConfig]:
    return {
        "actor_rollout_ref.actor.fsdp_config": cfg.actor_rollout_ref.actor.fsdp_config,
        "actor_rollout_ref.ref.fsdp_config": cfg.actor_rollout_ref.ref.fsdp_config,
        "critic.model.fsdp_config": cfg.critic.model.fsdp_config,
    }


def validate(cfg: Config) -> None:
    """The first problem found, as a ConfigError."""
    for section in (
        _choices,
        _domains,  # before the checks that divide by these values
        _strategy,
        _offload_policy,
        _trainer,
        _checkpoints,
        _sequence_parallel,  # before _batch_sizes, which divides the workers by the groups
        _batch_sizes,
        _rollout,
        _actor,
        _fused_kernels,
        _algorithm,
        validate_algorithm_keys,
        validate_filter_groups,
        validate_reward_model,
        validate_lora,
        validate_rollout_correction,
        validate_router_replay,
        validate_distillation,
        _pools,
        _rollout_pool,
        validate_profiler,
        validate_rollout_profiler,
        _kernels,
        _attention,
    ):
        section(cfg)


def _choices(cfg: Config) -> None:
    """Every enumerated key among its values."""
    d, a, r, t = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.trainer
    choices = {
        "algorithm.adv_estimator": (cfg.algorithm.adv_estimator, tuple(ESTIMATORS)),
        "actor_rollout_ref.actor.policy_loss.loss_mode": (a.policy_loss.loss_mode, tuple(POLICY_LOSSES)),
        # verl's workers/config/actor.py: raise ValueError if loss_agg_mode not in valid_loss_agg_modes
        "actor_rollout_ref.actor.loss_agg_mode": (
            a.loss_agg_mode,
            LOSS_AGG_MODES,
        ),
        "actor_rollout_ref.actor.kl_loss_type": (a.kl_loss_type, KL_KINDS),
        "algorithm.kl_penalty": (cfg.algorithm.kl_penalty, KL_KINDS),
        "algorithm.kl_ctrl.type": (cfg.algorithm.kl_ctrl.type, ("fixed", "adaptive")),
        "algorithm.pf_ppo.reweight_method": (cfg.algorithm.pf_ppo.reweight_method, ("pow", "max_min", "max_random")),
        "data.truncation": (d.truncation, ("error", "left", "right")),
        # verl's TokenizationSanityCheckModeEnum
        "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode": (
            r.multi_turn.tokenization_sanity_check_mode,
            SANITY_CHECK_MODES,
        ),
        "trainer.resume_mode": (t.resume_mode, ("auto", "disable", "resume_path")),
        # verl's main_ppo.py: raise ValueError(f"Invalid use_legacy_worker_impl: ...") for any other value
        "trainer.use_legacy_worker_impl": (t.use_legacy_worker_impl, ("auto", "enable", "disable")),
        "trainer.device": (t.device, ("auto", "cuda", "cpu")),
        "actor_rollout_ref.rollout.name": (r.name, ENGINE_NAMES),
        "actor_rollout_ref.actor.strategy": (a.strategy, ("ddp", "fsdp", "fsdp2")),
        "actor_rollout_ref.rollout.load_format": (r.load_format, ("dummy", "auto", "safetensors", "pt")),
    }
    # verl's workers/config/optimizer.py: assert lr_scheduler_type (or warmup_style) in ["constant", "cosine"]
    for prefix, optim in (("actor_rollout_ref.actor.optim", a.optim), ("critic.optim", cfg.critic.optim)):
        style = optim.warmup_style or optim.lr_scheduler_type
        choices[f"{prefix}.{'warmup_style' if optim.warmup_style else 'lr_scheduler_type'}"] = (
            style,
            ("constant", "cosine"),
        )
    for prefix, fc in fsdp_configs(cfg).items():
        mp = fc.mixed_precision
        for key, value in (
            ("model_dtype", fc.model_dtype),
            ("mixed_precision.param_dtype", mp.param_dtype),
            ("mixed_precision.reduce_dtype", mp.reduce_dtype),
        ):
            if value is not None:
                choices[f"{prefix}.{key}"] = (value, DTYPES)
        choices[f"{prefix}.mixed_precision.buffer_dtype"] = (mp.buffer_dtype, DTYPES)
    for key, (value, allowed) in choices.items():
        if value not in allowed:
            raise ConfigError(f"{key}={value!r}: choose one of {', '.join(allowed)}")


def _domains(cfg: Config) -> None:
    """Every numeric key within its own range (config/domains.py)."""
    for key, domain in DOMAINS.items():
        why = domain.refusal(key, value_at(cfg, key))
        if why:
            raise ConfigError(why)


def _expert_parallel(cfg: Config, prefix: str, ep: int, workers: int | None) -> None:
    """fsdp_config.expert_parallel_size (rlrig's own key, model/expert_parallel.py): the actor's and the reference's
    experts split over rows of ep consecutive workers of FSDP2; what it is not built with is refused here (the
    model's expert count and the engine, at start-up: workers/start_checks.py)."""
    if ep == 1:
        return
    a, key = cfg.actor_rollout_ref, f"{prefix}.expert_parallel_size={ep}"
    if ep < 1:
        raise ConfigError(f"{key}: a number of workers, at least 1")
    refusals = (
        (prefix == "critic.model.fsdp_config", "expert parallelism for the critic is not in rlrig; leave it 1"),
        (a.actor.strategy != "fsdp", "experts split under FSDP2; set actor_rollout_ref.actor.strategy=fsdp"),
        (workers is None, "the reference's own pool holds whole copies; leave it 1"),
        (workers is not None and workers % ep, f"it does not divide the role's {workers} workers"),
        (
            sequence_parallel(cfg)["actor"] > 1,
            "with Ulysses sequence parallelism is not in rlrig; set ulysses_sequence_parallel_size=1",
        ),
        (a.model.uses_lora, "with LoRA is not in rlrig; set actor_rollout_ref.model.lora_rank=0"),
        (
            prefix in fsdp_configs(cfg) and fsdp_configs(cfg)[prefix].offload_policy,
            "with FSDP2's offload policy is not in rlrig: FSDP leaves the experts alone, so they would stay on the "
            "GPU beside shards in host memory, which its state dicts refuse to load; set offload_policy=False "
            "(param_offload moves the whole model out between phases)",
        ),
    )
    why = next((why for refused, why in refusals if refused), None)
    if why:
        raise ConfigError(f"{key}: {why}")


def _strategy(cfg: Config) -> None:
    """Data parallelism: FSDP's offload, and the reference sharded as the actor."""
    a = cfg.actor_rollout_ref.actor
    for prefix in ("actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config"):
        if fsdp_configs(cfg)[prefix].param_offload and a.strategy != "fsdp":
            # DDP keeps a full replica and gradient buckets on the device: moving the weights out saves little
            raise ConfigError(
                f"{prefix}.param_offload=True offloads FSDP shards; set actor_rollout_ref.actor.strategy=fsdp "
                "(or leave param_offload=False)"
            )
    for model in ("actor_rollout_ref.model", "critic.model"):
        if value_at(cfg, model).enable_activation_offload and a.strategy != "fsdp":
            # verl offloads per FSDP unit and asserts an FSDP strategy; DDP's reducer also rejects the reentrant
            # checkpointing that offload uses with gradient checkpointing
            raise ConfigError(
                f"{model}.enable_activation_offload=True offloads per FSDP unit; set actor_rollout_ref.actor.strategy="
                "fsdp (or leave it False)"
            )
    t, c, ref = cfg.trainer, cfg.critic, cfg.actor_rollout_ref.ref
    pools = {  # the workers each model is sharded over
        "actor_rollout_ref.actor.fsdp_config": t.nnodes * t.n_gpus_per_node,
        "actor_rollout_ref.ref.fsdp_config": None if ref.enable_resource_pool else t.nnodes * t.n_gpus_per_node,
        "critic.model.fsdp_config": c.nnodes * c.n_gpus_per_node
        if c.enable_resource_pool
        else t.nnodes * t.n_gpus_per_node,
    }
    for prefix, fc in fsdp_configs(cfg).items():
        _expert_parallel(cfg, prefix, fc.expert_parallel_size, pools[prefix])
        size, workers = fc.fsdp_size, pools[prefix]
        if size == -1:
            continue
        if a.strategy != "fsdp" or workers is None:
            where = "the reference's own pool holds whole copies" if workers is None else "DDP keeps whole replicas"
            raise ConfigError(f"{prefix}.fsdp_size={size} sets FSDP's shard group, but {where}; leave it -1")
        if size < workers and workers % size:
            raise ConfigError(
                f"{prefix}.fsdp_size={size} does not divide the {workers} workers it shards over; use a divisor or -1"
            )
    for key, role, strategy in (
        ("actor_rollout_ref.ref.strategy", "reference", ref.strategy),
        ("critic.strategy", "critic", c.strategy),
    ):
        if strategy is not None and canonical_strategy(strategy) != a.strategy:
            raise ConfigError(
                f"{key}={strategy}: rlrig shards the {role} as it does the actor "
                f"(actor_rollout_ref.actor.strategy={a.strategy}); leave it unset or equal"
            )


def _offload_policy(cfg: Config) -> None:
    """fsdp_config.offload_policy is FSDP2's CPUOffloadPolicy: only for a model that FSDP2 shards."""
    a, ref = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.ref
    for prefix, fc in fsdp_configs(cfg).items():
        if not fc.offload_policy:
            continue
        if a.strategy != "fsdp":
            raise ConfigError(
                f"{prefix}.offload_policy=True is FSDP2's CPU offload policy, but actor_rollout_ref.actor.strategy="
                f"{a.strategy} keeps whole DDP replicas; set actor_rollout_ref.actor.strategy=fsdp (or leave it False)"
            )
        if prefix == "actor_rollout_ref.ref.fsdp_config" and ref.enable_resource_pool:
            raise ConfigError(
                f"{prefix}.offload_policy=True is FSDP2's CPU offload policy, but the reference's own pool holds "
                "whole copies, not FSDP shards; set actor_rollout_ref.ref.fsdp_config.param_offload=True instead"
            )


def _rollout(cfg: Config) -> None:
    """The rollout engine: its mode, engine arguments, lengths and tensor parallelism."""
    d, r, t = cfg.data, cfg.actor_rollout_ref.rollout, cfg.trainer
    if r.mode not in ("async", "sync"):
        raise ConfigError(
            f"actor_rollout_ref.rollout.mode={r.mode}: verl's modes are async (its default) and sync; "
            "both give rlrig's single-turn rollout"
        )
    # an empty mapping for another engine is verl's default (engine_kwargs.trtllm: {}), which no engine reads
    unknown_engines = {k for k, v in r.engine_kwargs.items() if k not in ENGINES and v}
    if unknown_engines:
        raise ConfigError(
            f"actor_rollout_ref.rollout.engine_kwargs.{sorted(unknown_engines)[0]}: rlrig's engines are "
            f"{', '.join(ENGINES)}"
        )
    if r.trace.backend == "weave":
        raise ConfigError(
            "actor_rollout_ref.rollout.trace.backend=weave: Weave traces are not in rlrig; backend=mlflow writes "
            "the same traces to MLflow"
        )
    if r.trace.backend not in (None, "mlflow"):
        raise ConfigError(f"actor_rollout_ref.rollout.trace.backend={r.trace.backend}: choose mlflow (or null)")
    if (r.trace.max_samples_per_step_per_worker or 0) < 0:
        raise ConfigError(
            "actor_rollout_ref.rollout.trace.max_samples_per_step_per_worker="
            f"{r.trace.max_samples_per_step_per_worker}: a number of prompts, 0 or more (or null: all)"
        )
    if r.max_model_len is not None and r.max_model_len < d.max_prompt_length + d.max_response_length:
        raise ConfigError(
            f"actor_rollout_ref.rollout.max_model_len={r.max_model_len} is shorter than "
            f"data.max_prompt_length + data.max_response_length = {d.max_prompt_length + d.max_response_length}"
        )
    # the engines span the training workers, or a rollout pool's of its own (hybrid_engine=False)
    pool, prefix = (t, "trainer") if cfg.actor_rollout_ref.hybrid_engine else (cfg.rollout, "rollout")
    tp, per_node, workers = r.tensor_model_parallel_size, pool.n_gpus_per_node, pool.nnodes * pool.n_gpus_per_node
    if workers < 1:  # a rollout pool without workers is refused in _rollout_pool, naming its keys
        return
    if tp < 1 or workers % tp or (per_node % tp if tp <= per_node else tp % per_node):
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: each engine spans that many workers, "
            f"so it must divide {prefix}.n_gpus_per_node={per_node} or be a multiple of it and divide "
            f"the {workers} workers"
        )
    ep = r.expert_parallel_size
    if ep not in (1, tp):
        raise ConfigError(
            f"actor_rollout_ref.rollout.expert_parallel_size={ep} must be 1 or equal tensor_model_parallel_size * "
            f"data_parallel_size = {tp} (verl's rule; rlrig's engines are not data parallel)"
        )
    if ep > 1 and r.name not in ("vllm", "sglang"):
        raise ConfigError(
            f"actor_rollout_ref.rollout.expert_parallel_size={ep} splits experts in vllm and sglang; rlrig's {r.name} "
            "engine holds every expert (leave it 1)"
        )
    if tp > 1 and r.name in ENGINES and not ENGINES[r.name].tensor_parallel:
        capable = ", ".join(n for n, e in ENGINES.items() if e.tensor_parallel)
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size>1 works with rollout.name={capable}; "
            f"rlrig's {r.name} engine runs one GPU per worker (tensor_model_parallel_size=1)"
        )


def _trainer(cfg: Config) -> None:
    """Loggers, the data sampler, checkpoints' storage and resuming, placement's wait."""
    d, t = cfg.data, cfg.trainer
    bad_loggers = [x for x in t.logger if x not in LOGGERS]
    if bad_loggers:
        raise ConfigError(
            f"trainer.logger: {', '.join(map(str, bad_loggers))} is not in rlrig; it logs to {', '.join(LOGGERS)}"
        )
    if d.sampler.class_name and not d.sampler.class_path:
        raise ConfigError(
            f"data.sampler.class_name={d.sampler.class_name} is set and class_path is not; name the file or pkg:// "
            "module that holds it"
        )
    if t.default_hdfs_dir:
        raise ConfigError(
            f"trainer.default_hdfs_dir={t.default_hdfs_dir}: rlrig does not copy checkpoints to HDFS; leave it "
            "null and point trainer.default_local_dir at shared storage"
        )
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")
    nccl = cfg.actor_rollout_ref.nccl_timeout
    if t.watchdog_min_s > nccl - WATCHDOG_MARGIN_S:
        raise ConfigError(
            f"trainer.watchdog_min_s={t.watchdog_min_s:g} leaves the watchdog no time before a waiting collective "
            f"times out (actor_rollout_ref.nccl_timeout={nccl:g}): keep it at most nccl_timeout - "
            f"{WATCHDOG_MARGIN_S:g}, or raise nccl_timeout"
        )


def _checkpoints(cfg: Config) -> None:
    """What checkpoints hold: names among verl's (verl's checkpoint manager ignores a name it does not know)."""
    for prefix, ck in (
        ("actor_rollout_ref.actor.checkpoint", cfg.actor_rollout_ref.actor.checkpoint),
        ("critic.checkpoint", cfg.critic.checkpoint),
    ):
        for key, names in (("save_contents", ck.save_contents), ("load_contents", ck.load_contents or [])):
            bad = [n for n in names if n not in CHECKPOINT_CONTENTS]
            if bad:
                raise ConfigError(
                    f"{prefix}.{key}: {bad[0]!r} is not a checkpoint content; choose among verl's "
                    f"{', '.join(CHECKPOINT_CONTENTS)}"
                )


def _sequence_parallel(cfg: Config) -> None:
    """Ulysses groups (model/ulysses.py): whole groups of workers, padding-free inputs (verl asserts the same), and
    one grouping of the samples for every pass that runs on the training workers."""
    sp, workers = sequence_parallel(cfg), cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    a, key = cfg.actor_rollout_ref, "ulysses_sequence_parallel_size"
    if workers % sp["actor"]:
        raise ConfigError(
            f"actor_rollout_ref.actor.{key}={sp['actor']} does not divide the {workers} workers "
            "(trainer.nnodes x trainer.n_gpus_per_node)"
        )
    for prefix, model, size in (
        ("actor_rollout_ref.actor", "actor_rollout_ref.model", sp["actor"]),
        ("critic", "critic.model", sp["critic"]),
    ):
        if size > 1 and not value_at(cfg, model).use_remove_padding:
            raise ConfigError(f"{prefix}.{key}={size} splits padding-free inputs; set {model}.use_remove_padding=True")
    for prefix, role, name in (("actor_rollout_ref.ref", a.ref, "ref"), ("critic", cfg.critic, "critic")):
        size = sp[name]
        if size not in (1, sp["actor"]):
            raise ConfigError(
                f"{prefix}.{key}={size}: the {name} runs on the actor's samples, grouped by "
                f"actor_rollout_ref.actor.{key}={sp['actor']}; set it to 1 or {sp['actor']}"
            )
        if size > 1 and role.enable_resource_pool:
            raise ConfigError(
                f"{prefix}.{key}={size} with {prefix}.enable_resource_pool=True: sequence parallelism in a pool of its "
                f"own is not in rlrig; set {prefix}.{key}=1 or keep it with the actor"
            )
    if sp["actor"] > 1 and cfg.algorithm.use_pf_ppo:
        raise ConfigError(
            f"algorithm.use_pf_ppo=True with actor_rollout_ref.actor.{key}={sp['actor']}: PF-PPO's resampling over "
            "sequence-parallel groups is not in rlrig; set one of them off"
        )


def _batch_sizes(cfg: Config) -> None:
    """Batch, mini-batch and micro-batch sizes and token budgets: whole numbers that divide as the update needs."""
    d, a, t = cfg.data, cfg.actor_rollout_ref.actor, cfg.trainer
    workers = t.nnodes * t.n_gpus_per_node
    longest = d.max_prompt_length + d.max_response_length
    for key, budget in token_budgets(cfg).items():
        if budget is not None and budget < longest:
            raise ConfigError(
                f"{key}={budget} is shorter than one sequence (data.max_prompt_length + "
                f"data.max_response_length = {longest}); raise it"
            )
    groups = workers // sequence_parallel(cfg)["actor"]
    # colocated engines generate each worker's own prompts, so batches split by prompt, unless the prompts do not
    # divide over the workers; a rollout pool's samples are shared by sample, as verl dispatches them, so there (and
    # in a colocated step shared by sample) only the samples need to divide
    by_prompt = cfg.actor_rollout_ref.hybrid_engine and not shares_by_sample(cfg)
    n = 1 if by_prompt else cfg.actor_rollout_ref.rollout.n
    what = "prompts" if n == 1 else f"prompts x actor_rollout_ref.rollout.n={n} samples"
    for key, mini in mini_batch_prompts(cfg).items():
        if d.train_batch_size % mini:
            raise ConfigError(f"data.train_batch_size={d.train_batch_size} is not a multiple of {key}={mini}")
        if mini * n % groups:
            over = f"{workers} workers" if groups == workers else f"{groups} sequence-parallel groups of workers"
            raise ConfigError(
                f"{key}={mini} {what} cannot be split over {over} (trainer.nnodes x trainer.n_gpus_per_node); make "
                f"it a multiple of {groups // math.gcd(n, groups)}"
            )
    if d.train_batch_size * n % workers:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} {what} cannot be shared by {workers} workers "
            f"(trainer.nnodes x trainer.n_gpus_per_node); make it a multiple of {workers // math.gcd(n, workers)}"
        )
    if t.device == "cuda":
        why = micro_batch_refusal(cfg)
        if why:
            raise ConfigError(why)
    for key, micro, role in (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", a.ppo_micro_batch_size_per_gpu, "actor"),
        ("critic.ppo_micro_batch_size_per_gpu", cfg.critic.ppo_micro_batch_size_per_gpu, "critic"),
    ):
        per_worker_mini = per_worker_mini_batch(cfg, workers, role)
        micro = micro or per_worker_mini
        if per_worker_mini % min(micro, per_worker_mini):
            raise ConfigError(
                f"each worker's mini batch ({per_worker_mini} sequences) is not a multiple of {key}={micro}"
            )


def micro_batch_refusal(cfg: Config) -> str | None:
    """verl refuses a GPU run that leaves a pass's micro batch unset: that pass would hold its whole batch's logits at
    once (1024 prompts x 5 samples over 16 GPUs: 320 sequences, tens of GB at a 152k vocabulary). A pass under a token
    budget (use_dynamic_bsz) needs none. Asked when trainer.device=cuda, and by the driver once auto chose GPUs."""
    a, c, budgets = cfg.actor_rollout_ref, cfg.critic, token_budgets(cfg)
    passes = [  # (micro batch key, its value, the token budget that replaces it, whether the run has the pass)
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", a.actor.ppo_micro_batch_size_per_gpu,
         "actor_rollout_ref.actor.ppo_max_token_len_per_gpu", True),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", a.rollout.log_prob_micro_batch_size_per_gpu,
         "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu", True),
        ("actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", a.ref.log_prob_micro_batch_size_per_gpu,
         "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", cfg.ref_in_use),
        ("critic.ppo_micro_batch_size_per_gpu", c.ppo_micro_batch_size_per_gpu,
         "critic.ppo_max_token_len_per_gpu", cfg.critic_in_use),
    ]  # fmt: skip
    unset = [key for key, micro, budget, used in passes if used and micro is None and budgets[budget] is None]
    if not unset:
        return None
    return (
        f"{', '.join(unset)} unset: on GPUs such a pass would hold its whole batch's logits at once; set "
        f"{'it' if len(unset) == 1 else 'them'} (verl refuses to run without), or use_dynamic_bsz=True with a token "
        "budget"
    )


def _actor(cfg: Config) -> None:
    """The actor's settings that depend on the model's."""
    a = cfg.actor_rollout_ref.actor
    if a.use_prefix_grouper and cfg.actor_rollout_ref.model.use_remove_padding:
        raise ConfigError(
            "actor_rollout_ref.actor.use_prefix_grouper=True shares prompts in the padded layout; set "
            "actor_rollout_ref.model.use_remove_padding=False (verl's grouper does not run with it either)"
        )
    m = cfg.actor_rollout_ref.model
    if a.use_prefix_grouper and m.enable_activation_offload and m.enable_gradient_checkpointing:
        # the offload checkpoints blocks itself (reentrant), and its recompute does not rebuild the grouper's shared
        # prompt records as transformers' checkpointing does
        raise ConfigError(
            "actor_rollout_ref.actor.use_prefix_grouper=True with model.enable_activation_offload=True and "
            "model.enable_gradient_checkpointing=True is not in rlrig; set one of the three False"
        )
    if a.use_prefix_grouper and a.calculate_sum_pi_squared:
        raise ConfigError(
            "actor_rollout_ref.actor.calculate_sum_pi_squared=True is not computed with use_prefix_grouper=True (verl "
            "asserts the same); set actor_rollout_ref.actor.use_prefix_grouper=False"
        )


def _fused_kernels(cfg: Config) -> None:
    """model.use_fused_kernels (model/fused_logprobs.py): the torch backend, and the passes that need no logits."""
    a, key = cfg.actor_rollout_ref, "actor_rollout_ref.model.use_fused_kernels=True"
    if not a.model.use_fused_kernels:
        return
    backend = a.model.fused_kernel_options.impl_backend
    if backend not in FUSED_BACKENDS:
        raise ConfigError(
            f"actor_rollout_ref.model.fused_kernel_options.impl_backend={backend!r}: choose one of "
            f"{', '.join(FUSED_BACKENDS)} (rlrig implements torch)"
        )
    if backend != "torch":
        raise ConfigError(
            f"actor_rollout_ref.model.fused_kernel_options.impl_backend={backend}: verl's {backend} kernel for the "
            "fused head is not in rlrig; use impl_backend=torch (the same numbers, a chunk of tokens at a time)"
        )
    if a.actor.calculate_sum_pi_squared:
        raise ConfigError(
            f"actor_rollout_ref.actor.calculate_sum_pi_squared=True is not supported with {key}: fused kernels do "
            "not materialize the full logits needed for sum_pi_squared (verl refuses it too); set one of them False"
        )
    if a.actor.use_prefix_grouper:
        raise ConfigError(
            f"actor_rollout_ref.actor.use_prefix_grouper=True with {key} is not in rlrig (the shared prompts' "
            "forward predicts for a prompt, not a sample); set one of them False"
        )


def _algorithm(cfg: Config) -> None:
    """What the advantage estimator needs."""
    r = cfg.actor_rollout_ref.rollout
    est = ESTIMATORS[cfg.algorithm.adv_estimator]
    if cfg.algorithm.use_pf_ppo and est.name != "gae":
        raise ConfigError(
            f"algorithm.use_pf_ppo=True: verl resamples only after adv_estimator=gae (with {est.name} it "
            "does nothing); set algorithm.adv_estimator=gae or use_pf_ppo=False"
        )
    if est.needs_groups and r.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={est.name} needs at least 2 samples of each prompt; "
            "set actor_rollout_ref.rollout.n to 2 or more"
        )
    if est.needs_sum_pi_squared and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
        raise ConfigError(
            f"algorithm.adv_estimator={est.name} needs sum_pi_squared from the actor's old-log-prob pass (verl "
            "asserts it); set actor_rollout_ref.actor.calculate_sum_pi_squared=True"
        )
    if est.needs_sum_pi_squared and cfg.algorithm.rollout_correction.bypass_mode:
        raise ConfigError(
            f"algorithm.adv_estimator={est.name} needs sum_pi_squared from the actor's old-log-prob pass, which "
            "algorithm.rollout_correction.bypass_mode=True skips (verl fails at its first step); set bypass_mode=False"
        )


def validate_filter_groups(cfg: Config) -> None:
    """DAPO's dynamic sampling (algorithm.filter_groups.enable) as rlrig runs it: colocated, one generation batch of
    data.gen_batch_size prompts at a time, each worker generating an equal share of it."""
    fg, d, t = cfg.algorithm.filter_groups, cfg.data, cfg.trainer
    if not fg.enable:
        return
    key = "algorithm.filter_groups"
    if not cfg.actor_rollout_ref.hybrid_engine:
        raise ConfigError(
            f"{key}.enable=True with actor_rollout_ref.hybrid_engine=False: rlrig's dynamic sampling runs in the "
            "colocated mode (as verl's DAPO recipe does), not with a rollout pool of its own or asynchronously; set "
            "actor_rollout_ref.hybrid_engine=True or algorithm.filter_groups.enable=False"
        )
    if not fg.metric:
        raise ConfigError(
            f"{key}.metric must be set when group filtering is enabled (verl's words): acc, score, "
            "reward, seq_reward, seq_final_reward or a field your reward function returns"
        )
    if fg.metric == "seq_final_reward" and cfg.algorithm.use_kl_in_reward:
        raise ConfigError(
            f"{key}.metric=seq_final_reward with algorithm.use_kl_in_reward=True: rlrig applies the KL penalty after "
            "the filter, so the rewards with it are not known when groups are dropped; use seq_reward or set "
            "use_kl_in_reward=False"
        )
    if fg.max_inflight_gen_batches != 1:
        raise ConfigError(
            f"{key}.max_inflight_gen_batches={fg.max_inflight_gen_batches}: rlrig generates one generation batch at "
            "a time, as verl's DAPO recipe does (more in flight is verl's v1 trainer's); set it to 1"
        )
    workers, gen = t.nnodes * t.n_gpus_per_node, d.gen_batch_size or d.train_batch_size
    if d.train_batch_size % workers:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} prompts with {key}.enable=True cannot be shared by {workers} "
            "workers (trainer.nnodes x trainer.n_gpus_per_node): each trains on whole kept groups; make it a "
            f"multiple of {workers}"
        )
    if gen % workers:
        raise ConfigError(
            f"data.gen_batch_size={gen} prompts cannot be shared by {workers} workers (trainer.nnodes x "
            f"trainer.n_gpus_per_node), each of which generates its share; make it a multiple of {workers}"
        )


def _pools(cfg: Config) -> None:
    """Roles in pools of their own, and custom placement resources."""
    t = cfg.trainer
    workers = t.nnodes * t.n_gpus_per_node
    ref = cfg.actor_rollout_ref.ref
    if ref.enable_resource_pool and not cfg.ref_in_use:
        raise ConfigError(
            "actor_rollout_ref.ref.enable_resource_pool=True but this run has no reference model (it needs "
            "actor.use_kl_loss=True or algorithm.use_kl_in_reward=True)"
        )
    if cfg.critic.enable_resource_pool and not cfg.critic_in_use:
        raise ConfigError(
            f"critic.enable_resource_pool=True but algorithm.adv_estimator={cfg.algorithm.adv_estimator} "
            "trains no critic (gae does)"
        )
    c = cfg.critic
    if c.enable_resource_pool and c.nnodes * c.n_gpus_per_node != workers:
        raise ConfigError(
            f"critic.enable_resource_pool=True: one critic worker per training worker, so critic.nnodes x "
            f"critic.n_gpus_per_node must be {workers} (trainer.nnodes x trainer.n_gpus_per_node), "
            f"not {c.nnodes} x {c.n_gpus_per_node}"
        )
    for prefix, pool in cfg.own_pools().items():
        if pool.nnodes < 1 or pool.n_gpus_per_node < 1:
            raise ConfigError(
                f"{prefix}.enable_resource_pool=True needs {prefix}.nnodes and {prefix}.n_gpus_per_node "
                f"of at least 1 (got {pool.nnodes} and {pool.n_gpus_per_node})"
            )
    for key, pc in (
        ("actor_rollout_ref.placement.resource", cfg.actor_rollout_ref.placement),
        ("actor_rollout_ref.ref.placement.resource", ref.placement),
        ("critic.placement.resource", cfg.critic.placement),
        ("reward_model.placement.resource", cfg.reward_model.placement),
    ):
        if pc.resource is not None and (not pc.resource or pc.resource in RAY_RESERVED):
            raise ConfigError(
                f"{key}={pc.resource!r}: name a custom resource the nodes offer (RLRIG_RESOURCES), not "
                f"{', '.join(RAY_RESERVED)}; trainer.device decides GPU or CPU"
            )


ASYNC_MODES = ("sync", "one_step_off_policy", "fully_async_policy")


def _rollout_pool(cfg: Config) -> None:
    """Rollout on a pool of its own (hybrid_engine=False) and the modes that overlap it with training."""
    a, mode, pool = cfg.actor_rollout_ref, cfg.trainer.async_mode, cfg.rollout
    if mode not in ASYNC_MODES:
        raise ConfigError(f"trainer.async_mode={mode!r}: choose one of {', '.join(ASYNC_MODES)}")
    if a.hybrid_engine:
        if mode != "sync":
            raise ConfigError(
                f"trainer.async_mode={mode} generates while the trainer trains, so the engines need a pool of their "
                "own: set actor_rollout_ref.hybrid_engine=False with rollout.nnodes and rollout.n_gpus_per_node"
            )
        return
    if pool.nnodes < 1 or pool.n_gpus_per_node < 1:
        raise ConfigError(
            f"actor_rollout_ref.hybrid_engine=False puts the engines on a pool of their own: rollout.nnodes and "
            f"rollout.n_gpus_per_node must be at least 1 (got {pool.nnodes} and {pool.n_gpus_per_node})"
        )
    own_pool_lacks = {
        "reward_model.enable": (cfg.reward_model.enable, "rule-based rewards (custom_reward_function.*)"),
        # verl's recipe config: "Must be turned off! Otherwise, Parameter synchronization cannot be performed."
        "actor_rollout_ref.rollout.free_cache_engine": (a.rollout.free_cache_engine, "engines that stay awake"),
        "algorithm.adv_estimator": (
            ESTIMATORS[cfg.algorithm.adv_estimator].needs_greedy_baseline,
            "estimators without ReMax's greedy baseline",
        ),
    }
    for key, (asked, offered) in own_pool_lacks.items():
        if asked:
            raise ConfigError(
                f"{key}={value_at(cfg, key)} with actor_rollout_ref.hybrid_engine=False: a rollout pool of its own "
                f"takes {offered} in rlrig; set actor_rollout_ref.hybrid_engine=True for it"
            )
    if mode == "fully_async_policy" and cfg.async_training.use_trainer_do_validate:
        raise ConfigError(
            "async_training.use_trainer_do_validate=True: validating on the training workers' own engines is not in "
            "rlrig; the rollout pool validates (every rollout.test_freq weight versions)"
        )


def validate_rollout_correction(cfg: Config) -> None:
    rc, p = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is not in (None, "token", "sequence"):
        raise ConfigError(f"{p}.rollout_is={rc.rollout_is}: choose token, sequence or null (off)")
    if rc.rollout_is and rc.rollout_is_threshold is None:  # verl reads the threshold only with rollout_is on
        raise ConfigError(f"{p}.rollout_is={rc.rollout_is} needs {p}.rollout_is_threshold (the weights' upper bound)")
    if rc.loss_type not in LOSS_TYPES:
        raise ConfigError(f"{p}.loss_type={rc.loss_type}: choose one of {', '.join(LOSS_TYPES)}")
    if rc.rollout_rs is not None:  # verl reads the threshold only with rejection sampling on
        try:
            options = rollout_correction.rs_options(rc.rollout_rs)
        except ValueError as e:
            raise ConfigError(
                f"{p}.rollout_rs={rc.rollout_rs}: {e}; several are comma-separated, null turns it off"
            ) from None
        try:
            rollout_correction.rs_thresholds(options, rc.rollout_rs_threshold)
        except ValueError as e:
            raise ConfigError(
                f"{p}.rollout_rs_threshold={rc.rollout_rs_threshold} (rollout_rs={rc.rollout_rs}): {e}; give a "
                "number, or lower_upper for a k1 option"
            ) from None
    # a rollout pool of its own computes the hf engine's log-probs of its samples (workers/rollout_worker.py)
    why = rollout_is_refusal(rc, cfg.actor_rollout_ref.rollout.name) if cfg.actor_rollout_ref.hybrid_engine else None
    if why:
        raise ConfigError(why)


ROUTER_REPLAY_MODES = ("disabled", "R2", "R3")


def validate_router_replay(cfg: Config) -> None:
    """MoE routing replay (model/moe.py), as verl's RouterReplayConfig and its config checks allow it; what rlrig
    does not build is refused. The model and the engine are asked at start-up (workers/start_checks.py)."""
    a = cfg.actor_rollout_ref
    mode, k = a.actor.router_replay.mode, "actor_rollout_ref.actor.router_replay.mode"
    recorded = a.rollout.enable_rollout_routing_replay
    if mode not in ROUTER_REPLAY_MODES:  # verl: ValueError(Invalid router_replay mode ...)
        raise ConfigError(f"{k}={mode}: choose one of {', '.join(ROUTER_REPLAY_MODES)}")
    if mode == "R2" and cfg.algorithm.rollout_correction.bypass_mode:  # verl's utils/config.py
        raise ConfigError(
            f"{k}=R2 requires algorithm.rollout_correction.bypass_mode=False: R2 records routes while recomputing "
            "actor old_log_probs, but bypass mode skips that forward"
        )
    at = cfg.async_training
    if mode == "R2" and cfg.trainer.async_mode == "fully_async_policy" and at.use_rollout_log_probs:
        if not at.compute_prox_log_prob:  # the engine's log-probs stand for the old ones: no pass to record in
            raise ConfigError(
                f"{k}=R2 records routes while recomputing the actor's old log-probs, which "
                "async_training.use_rollout_log_probs=True skips; set async_training.compute_prox_log_prob=True or "
                "use R3"
            )
    if mode == "R2" and recorded:  # verl's ray_trainer: the two cannot be enabled simultaneously
        raise ConfigError(
            f"{k}=R2 and actor_rollout_ref.rollout.enable_rollout_routing_replay=True cannot be enabled "
            "simultaneously: the engine's routing is replayed only in R3 mode; set one of them"
        )
    if mode == "R3" and not recorded:
        raise ConfigError(
            f"{k}=R3 replays the engine's routing, which actor_rollout_ref.rollout.enable_rollout_routing_replay=True "
            "records; set it"
        )
    if mode == "disabled":
        return
    if a.actor.ulysses_sequence_parallel_size > 1:
        raise ConfigError(
            f"{k}={mode} with actor_rollout_ref.actor.ulysses_sequence_parallel_size="
            f"{a.actor.ulysses_sequence_parallel_size}: routing replay under sequence parallelism is not in rlrig"
        )
    if a.actor.use_prefix_grouper:
        raise ConfigError(f"{k}={mode}: the forwards of shared prompts (actor.use_prefix_grouper) replay no routing")
    if mode == "R3" and cfg.trainer.async_mode == "fully_async_policy" and cfg.async_training.partial_rollout:
        raise ConfigError(
            f"{k}=R3 with async_training.partial_rollout=True: a sample drawn across weight syncs keeps no routing in "
            "rlrig; set partial_rollout=False"
        )


def rollout_is_refusal(rc, engine: str) -> str | None:
    """Rollout correction (importance weights, rejection sampling, bypass mode) works on the engine's own
    log-probs, which the hf engine does not compute. Asked of the configured name here, and by the driver of the
    engine that rollout.name=auto chose."""
    if engine != "hf":
        return None
    keys = (("rollout_is", rc.rollout_is), ("rollout_rs", rc.rollout_rs), ("bypass_mode", rc.bypass_mode))
    asked = [f"{key}={value}" for key, value in keys if value]
    if not asked:
        return None
    return (
        f"algorithm.rollout_correction.{asked[0]} works on the engine's own log-probs, which the hf engine does "
        "not compute; install vLLM or SGLang and set actor_rollout_ref.rollout.name to it"
    )


def validate_lora(cfg: Config) -> None:
    m = cfg.actor_rollout_ref.model
    if m.lora_rank < 0 or m.lora_alpha <= 0:
        raise ConfigError(
            f"actor_rollout_ref.model.lora_rank={m.lora_rank}, lora_alpha={m.lora_alpha}: the rank is 0 "
            "(no LoRA) or more, the alpha above 0"
        )
    for key, value, optional in (
        ("target_modules", m.target_modules, False),
        ("exclude_modules", m.exclude_modules, True),
    ):
        if value is None and optional:
            continue
        names = value if isinstance(value, list) else [value]
        if not names or not all(isinstance(x, str) and x for x in names):
            raise ConfigError(
                f"actor_rollout_ref.model.{key}={value!r}: give all-linear, a module-name regex, or a list "
                "of module names such as [q_proj,v_proj]"
            )
    if m.uses_lora and cfg.actor_rollout_ref.ref.enable_resource_pool:
        raise ConfigError(
            "actor_rollout_ref.ref.enable_resource_pool=True with LoRA: the reference is the actor with its "
            "adapters disabled, as in verl, so it has no workers of its own; set it False"
        )


def validate_reward_model(cfg: Config) -> None:
    rm = cfg.reward_model
    overlong(rm)  # the manager and its reward_kwargs, whether or not a model scores
    check_name(rm, cfg.custom_reward_function.path)
    if rm.enable and rm.use_reward_loop:
        validate_reward_loop(rm.rollout, rm.enable_resource_pool, cfg.trainer.n_gpus_per_node)


def validate_reward_loop(r: RewardModelRolloutConfig, own_pool: bool, per_node: int) -> None:
    if r.name != "vllm":
        raise ConfigError(
            f"reward_model.rollout.name={r.name}: rlrig's reward loop serves the reward model with vLLM; "
            "set reward_model.rollout.name=vllm (or use_reward_loop=False to score with transformers)"
        )
    k = r.tensor_model_parallel_size
    if k < 1 or k > 1 and own_pool:
        raise ConfigError(
            f"reward_model.rollout.tensor_model_parallel_size={k}: rlrig's reward engines span workers only "
            "colocated (reward_model.enable_resource_pool=False); in a pool of their own they run on one GPU each"
        )
    if per_node % k:
        raise ConfigError(
            f"reward_model.rollout.tensor_model_parallel_size={k}: one reward engine spans that many "
            f"training workers of one node, so it must divide trainer.n_gpus_per_node={per_node}"
        )
    unknown = set(r.engine_kwargs) - {"vllm"}
    if unknown:
        raise ConfigError(
            f"reward_model.rollout.engine_kwargs.{sorted(unknown)[0]}: the reward loop's engine is vLLM; "
            "put its arguments under reward_model.rollout.engine_kwargs.vllm"
        )


def validate_profiler(cfg: Config) -> None:
    """verl's profilers: one tool per run, the steps and ranks to record, torch's contents, one discrete mode for
    the roles that share the training workers' processes (and their one profiler)."""
    g = cfg.global_profiler
    if g.tool == "npu":
        raise ConfigError(
            "global_profiler.tool=npu: Ascend NPU profiling is not in rlrig; choose nsys, torch or torch_memory"
        )
    if g.tool is not None and g.tool not in TOOL_RECORDS_CPU:
        raise ConfigError(f"global_profiler.tool={g.tool!r}: choose one of {', '.join(TOOL_RECORDS_CPU)} (or null)")
    whole = lambda xs, low: all(isinstance(x, int) and not isinstance(x, bool) and x >= low for x in xs)
    if g.steps is not None and not whole(g.steps, 1):
        raise ConfigError(f"global_profiler.steps={g.steps}: give a list of step numbers, counting from 1 (or null)")
    for role, prefix in ROLE_KEYS.items():
        p, key = value_at(cfg, f"{prefix}.profiler"), f"{prefix}.profiler"
        if p.tool is not None and p.tool != g.tool:
            raise ConfigError(
                f"{key}.tool={p.tool}: rlrig runs one profiler tool per run, global_profiler.tool (now {g.tool}); "
                f"set that and leave {key}.tool unset or equal"
            )
        if not whole(p.ranks, 0):
            raise ConfigError(f"{key}.ranks={p.ranks}: give a list of the role's worker ranks, counting from 0")
        # the reward model's tool_config is the actor's
        bad = [c for c in p.tool_config.torch.contents if c not in TORCH_CONTENTS] if role != "reward_model" else []
        if bad:
            raise ConfigError(f"{key}.tool_config.torch.contents: {bad[0]!r} is not one of {', '.join(TORCH_CONTENTS)}")
    own = cfg.own_pools()
    shared = {role: role_profile(cfg, role) for role, prefix in ROLE_KEYS.items() if prefix not in own}
    modes = {role: p.discrete for role, p in shared.items() if p.enable}
    if g.tool in ("torch", "nsys") and len(set(modes.values())) > 1:
        a, b = (next(r for r, d in modes.items() if d is v) for v in (True, False))
        raise ConfigError(
            f"{ROLE_KEYS[a]}.profiler records discrete and {ROLE_KEYS[b]}.profiler does not, but both run in the "
            f"training workers, which have one profiler; give their tool_config.{g.tool}.discrete one value"
        )
    why = profiler_device_refusal(cfg)
    if why:
        raise ConfigError(why)


def validate_rollout_profiler(cfg: Config) -> None:
    """The rollout engines' own profiler (profiler_settings.rollout_profile): its keys' values, and an explicit
    enable=True that would record nothing (verl's engines record with torch in discrete mode only)."""
    r, g, key = cfg.actor_rollout_ref.rollout.profiler, cfg.global_profiler, ROLLOUT_KEY
    t = r.tool_config.torch
    if r.tool is not None and r.tool != g.tool:
        raise ConfigError(
            f"{key}.tool={r.tool}: rlrig runs one profiler tool per run, global_profiler.tool (now {g.tool}); set "
            f"that and leave {key}.tool unset or equal"
        )
    if r.ranks is not None and not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in r.ranks):
        raise ConfigError(f"{key}.ranks={r.ranks}: give a list of worker ranks, counting from 0")
    bad = [c for c in t.contents or () if c not in TORCH_CONTENTS]
    if bad:
        raise ConfigError(f"{key}.tool_config.torch.contents: {bad[0]!r} is not one of {', '.join(TORCH_CONTENTS)}")
    for name in ("profile_token_start", "profile_token_end"):
        if getattr(t, name) is not None and getattr(t, name) < 0:
            raise ConfigError(f"{key}.tool_config.torch.{name}={getattr(t, name)} must be 0 or more (or null)")
    if t.profile_token_end is not None and t.profile_token_end <= (t.profile_token_start or 0):
        raise ConfigError(
            f"{key}.tool_config.torch.profile_token_end={t.profile_token_end} must be above profile_token_start "
            f"({t.profile_token_start or 0}): the engine records the steps from the one to the other"
        )
    p = rollout_profile(cfg)
    if r.enable and p.tool != "torch":
        raise ConfigError(
            f"{key}.enable=True: the rollout engines record with torch.profiler only, as verl's do, and "
            f"global_profiler.tool is {g.tool}; set global_profiler.tool=torch"
        )
    if r.enable and not p.discrete:
        raise ConfigError(
            f"{key}.enable=True: the rollout engines record each generation on its own (discrete mode) only, as "
            f"verl's do; set {key}.tool_config.torch.discrete=True"
        )
    windowed = t.profile_token_start is not None or t.profile_token_end is not None
    if p.records and windowed and cfg.actor_rollout_ref.rollout.name == "hf":
        raise ConfigError(
            f"{key}.tool_config.torch.profile_token_start/profile_token_end count an engine's steps, which vLLM and "
            "SGLang take; the hf engine records the whole gen phase: leave them null"
        )


def profiler_device_refusal(cfg: Config) -> str | None:
    """A profiler tool that records CUDA (nsys, torch_memory) on a CPU run: trainer.device=cpu, or auto once the
    driver resolved it."""
    tool = cfg.global_profiler.tool
    if cfg.trainer.device != "cpu" or tool not in TOOL_RECORDS_CPU or TOOL_RECORDS_CPU[tool]:
        return None
    return (
        f"global_profiler.tool={tool} records CUDA work and this run is on CPU (trainer.device="
        f"{cfg.trainer.device}); global_profiler.tool=torch records CPU runs"
    )


def _attention(cfg: Config) -> None:
    why = attention_refusal(cfg)
    if why:
        raise ConfigError(why)


def attention_refusal(cfg: Config) -> str | None:
    """override_config.attn_implementation of the actor's and the critic's models (model/attention.py), on the run's
    device (again once trainer.device=auto is resolved)."""
    models = {"actor_rollout_ref.model": cfg.actor_rollout_ref.model}
    if cfg.critic_in_use and cfg.critic.model.path:
        models["critic.model"] = cfg.critic.model
    for prefix, model in models.items():
        key, impl = f"{prefix}.override_config.attn_implementation", attention.requested(model.override_config)
        why = attention.refusal(key, impl, cfg.trainer.device)
        if why:
            return why
    return None


def _kernels(cfg: Config) -> None:
    """Liger's kernels and the compiled log-prob math (model/kernels.py, model/compiled.py)."""
    why = compiled.math_refusal(cfg) or kernel_device_refusal(cfg)
    if why:
        raise ConfigError(why)


def kernel_device_refusal(cfg: Config) -> str | None:
    """A model section's use_liger on a CPU run (Liger's kernels are Triton's): trainer.device=cpu, or auto once the
    driver resolved it."""
    models = {"actor_rollout_ref.model": cfg.actor_rollout_ref.model}
    if cfg.critic_in_use:
        models["critic.model"] = cfg.critic.model
    for prefix, model in models.items():
        if model.use_liger and cfg.trainer.device == "cpu":
            return kernels.liger_device_refusal(f"{prefix}.use_liger", "cpu")
    return None
