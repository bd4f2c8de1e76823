"""distillation.* checked at start-up: what verl 0.9 refuses (DistillationLossConfig.__post_init__) and what rlrig
does not build, each in one line. The teacher's tokenizer is checked where the models are (workers/teacher.py)."""

from __future__ import annotations

from ..algos.distillation import ESTIMATOR_MODES, TOPK_MODES
from ..errors import ConfigError
from .teachers import TEACHERS, renamed, teachers

_LOSS = "distillation.distillation_loss"


def validate_distillation(cfg) -> None:
    """Nothing is read with distillation.enabled=False, as in verl."""
    d = cfg.distillation
    if not d.enabled:
        return
    lc = d.distillation_loss
    validate_teacher_names(cfg)
    if lc.loss_mode not in (*ESTIMATOR_MODES, *TOPK_MODES):
        modes = ", ".join((*ESTIMATOR_MODES, *TOPK_MODES))
        raise ConfigError(f"{_LOSS}.loss_mode={lc.loss_mode!r}: choose one of {modes}")
    if lc.loss_mode in TOPK_MODES:
        validate_topk(cfg)
    if lc.policy_loss_mode != "vanilla":  # verl: NotImplementedError
        raise ConfigError(
            f"{_LOSS}.policy_loss_mode={lc.policy_loss_mode}: verl builds only vanilla for the distillation loss"
        )
    if lc.loss_mode in ("kl", "k1") and not lc.use_policy_gradient:  # verl: ValueError
        raise ConfigError(
            f"{_LOSS}.loss_mode={lc.loss_mode} with use_policy_gradient=False: the gradient of k1 does not depend "
            f"on the teacher's log-probs; set {_LOSS}.use_policy_gradient=True or use k3"
        )
    if lc.loss_max_clamp is not None and not lc.loss_max_clamp > 0:
        raise ConfigError(f"{_LOSS}.loss_max_clamp={lc.loss_max_clamp} must be positive (or null)")
    for t in teachers(cfg):
        try:
            validate_teacher_engine(t.cfg)
        except ConfigError as e:
            raise ConfigError(renamed(str(e), t)) from None
    engines = [t.cfg.distillation.teacher_models.teacher_model.inference for t in teachers(cfg)]
    tp = max(inf.tensor_model_parallel_size for inf in engines)
    if len(engines) > 1 and tp > 1:
        raise ConfigError(
            f"{TEACHERS}.<name>.inference.tensor_model_parallel_size={tp} with several teachers: rlrig places each "
            "teacher's vLLM engine on one device when several teachers share the workers; set it to 1"
        )
    if d.nnodes < 0 or (d.nnodes > 0 and d.n_gpus_per_node < 1):
        raise ConfigError(
            f"distillation.nnodes={d.nnodes}, n_gpus_per_node={d.n_gpus_per_node}: the teacher's own pool needs "
            "both at least 1 (nnodes=0 holds the teacher in every training worker)"
        )


_INF = "distillation.teacher_models.teacher_model.inference"


def validate_teacher_engine(cfg) -> None:
    """The teacher's engine (inference.name, else the rollout's): hf (a whole copy per device) or vLLM (an engine
    over tensor_model_parallel_size devices of one node)."""
    inf = cfg.distillation.teacher_models.teacher_model.inference
    name = inf.name or cfg.actor_rollout_ref.rollout.name
    given = f"{_INF}.name={inf.name}" if inf.name else f"{_INF}.name (the rollout's, {name})"
    if name not in ("hf", "vllm", "auto"):
        raise ConfigError(
            f"{given}: rlrig computes the teacher's log-probs with hf or vllm; set {_INF}.name=vllm or hf"
        )
    if name != "hf":
        validate_teacher_span(cfg)
    unknown = set(inf.engine_kwargs) - {"vllm"}
    if unknown:
        raise ConfigError(f"{_INF}.engine_kwargs.{sorted(unknown)[0]}: put vLLM's arguments under engine_kwargs.vllm")


def validate_teacher_span(cfg) -> None:
    """A vLLM teacher engine spans tensor_model_parallel_size devices of one node: a worker of the teacher's pool
    holds them (verl's replica of its pool), or, colocated, that many training workers share one engine."""
    d, t = cfg.distillation, cfg.trainer
    k = d.teacher_models.teacher_model.inference.tensor_model_parallel_size
    if k < 1:
        raise ConfigError(f"{_INF}.tensor_model_parallel_size={k}: the devices of one teacher engine, 1 or more")
    if k == 1:
        return
    if d.nnodes > 0 and d.n_gpus_per_node % k:
        raise ConfigError(
            f"{_INF}.tensor_model_parallel_size={k}: each teacher engine holds that many devices of one node of the "
            f"teacher's pool (rlrig's engines do not span nodes), so it must divide "
            f"distillation.n_gpus_per_node={d.n_gpus_per_node}"
        )
    if d.nnodes == 0 and t.n_gpus_per_node % k:
        raise ConfigError(
            f"{_INF}.tensor_model_parallel_size={k}: colocated (distillation.nnodes=0), one teacher engine spans "
            f"that many training workers of one node, so it must divide trainer.n_gpus_per_node={t.n_gpus_per_node}"
        )


def validate_teacher_names(cfg) -> None:
    """The one teacher_model with its model_path, or teachers named beside it, each with its model_path and a key
    of its own (verl's check_configured and duplicate-key check). verl drops teacher_model where others are named,
    so a teacher_model given beside them is refused rather than dropped."""
    tm = cfg.distillation.teacher_models
    if not tm.named:
        if not tm.teacher_model.model_path:
            raise ConfigError(f"distillation.enabled=True needs the teacher: set {TEACHERS}.teacher_model.model_path")
        return
    if tm.teacher_model.model_path:
        raise ConfigError(
            f"{TEACHERS}.teacher_model.model_path with teachers named beside it ({', '.join(tm.named)}): verl drops "
            f"teacher_model then; give it a name of its own ({TEACHERS}.<name>.model_path and .key)"
        )
    seen: dict[str, str] = {}
    for name, t in tm.named.items():
        for field in ("model_path", "key"):
            if getattr(t, field) is None:
                raise ConfigError(f"{TEACHERS}.{name}.{field} is not set: each of several teachers needs it")
        if t.key in seen:
            raise ConfigError(
                f"{TEACHERS}.{name}.key={t.key}: teacher {seen[t.key]} has that key too; each teacher needs its own"
            )
        seen[t.key] = name


def validate_topk(cfg) -> None:
    """The top-k loss reads the student's whole logits at each response position and the teacher's top k."""
    lc, a = cfg.distillation.distillation_loss, cfg.actor_rollout_ref
    if lc.topk is None or lc.topk < 1:
        raise ConfigError(f"{_LOSS}.topk={lc.topk}: loss_mode={lc.loss_mode} reads the teacher's top k; set 1 or more")
    why = (
        (a.model.use_fused_kernels, "actor_rollout_ref.model.use_fused_kernels=True", "a fused head never makes"),
        (a.actor.use_prefix_grouper, "actor_rollout_ref.actor.use_prefix_grouper=True",
         "rlrig does not read with shared prompts"),
        (a.actor.ulysses_sequence_parallel_size > 1, "actor_rollout_ref.actor.ulysses_sequence_parallel_size > 1",
         "rlrig does not gather over a sequence-parallel group"),
    )  # fmt: skip
    for on, key, reason in why:
        if on:
            raise ConfigError(
                f"{_LOSS}.loss_mode={lc.loss_mode} with {key}: the loss reads the student's logits at every response "
                f"position, which {reason}; set it off or use an estimator mode (k3)"
            )
    for t in teachers(cfg):
        kw = t.cfg.distillation.teacher_models.teacher_model.inference.engine_kwargs.get("vllm", {})
        if kw.get("max_logprobs") is not None and kw["max_logprobs"] < lc.topk:
            raise ConfigError(
                f"{t.prefix}.inference.engine_kwargs.vllm.max_logprobs={kw['max_logprobs']} is below {_LOSS}.topk="
                f"{lc.topk}: vLLM then returns fewer prompt log-probs than the loss reads (verl refuses it too)"
            )
