"""distillation.* checked at start-up: what verl 0.9 refuses (DistillationLossConfig.__post_init__) and what rlrig
does not build, each in one line. The teacher's tokenizer is checked where the models are (workers/teacher.py)."""

from __future__ import annotations

from ..algos.distillation import ESTIMATOR_MODES, TOPK_MODES
from ..errors import ConfigError

_LOSS = "distillation.distillation_loss"


def validate_distillation(cfg) -> None:
    """Nothing is read with distillation.enabled=False, as in verl."""
    d = cfg.distillation
    if not d.enabled:
        return
    lc = d.distillation_loss
    if not d.teacher_models.teacher_model.model_path:
        raise ConfigError(
            "distillation.enabled=True needs the teacher: set distillation.teacher_models.teacher_model.model_path"
        )
    if lc.loss_mode in TOPK_MODES:
        raise ConfigError(
            f"{_LOSS}.loss_mode={lc.loss_mode} needs the teacher's top-k log-probs at every position, which rlrig "
            f"does not compute; use one of {', '.join(ESTIMATOR_MODES)} (the sampled token's log-prob only)"
        )
    if lc.loss_mode not in ESTIMATOR_MODES:
        raise ConfigError(f"{_LOSS}.loss_mode={lc.loss_mode!r}: choose one of {', '.join(ESTIMATOR_MODES)}")
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
    validate_teacher_engine(cfg)
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
