"""The distillation teacher (distillation.enabled): its log-probs of the student's sampled tokens, from the hf
engine's forward pass over prompt and response or vLLM's prompt log-probs (inference.name, verl's default the
rollout's engine: workers/vllm_teacher.py), at temperature 1 as verl's teacher computes them (prompt log-probs are
a forward pass: verl sets its teacher's temperature to 1 whatever the rollout's). Where it runs is
chosen once (teacher_source): a whole copy held in every training worker (distillation.nnodes=0), or a pool of its
own (TeacherWorker, nnodes x n_gpus_per_node workers) that the training workers send their samples to, as the
reference's pool.

With a top-k loss mode (forward_kl_topk) the teacher gives its k likeliest tokens' log-probs and ids at each
position instead ([B, R, K] each: the hf forward's top k, or vLLM's prompt_logprobs=k). With several teachers
(config/teachers.py) each is built as the one would be, where the one would be, and each sample is scored by the
teacher its StepBatch.teacher names (teacher_choice, from its row's distillation.teacher_key). A teacher's answer is
the batch's fields: {"teacher_logp": ...} and, top-k, "teacher_ids"."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from .. import determinism
from ..algos.distillation import TOPK_MODES
from ..batch.step_batch import StepBatch
from ..config.schema import from_dict
from ..config.teachers import Teacher, route_refusal, teachers
from ..errors import ConfigError
from ..model import micro_batches as batching
from ..model.build import load_reference
from ..model.forward import ForwardOptions, in_micro_batches, topk_token_logprobs
from ..model.loading import load_kwargs
from .base import PoolWorker, ensure_local_embedded_model, single_device, whole_model_logprobs
from .step.sources import LocalLogProbs

# the teacher's passes take the reference's micro batches and token budget (verl's teacher is a server of its own)
MICRO_KEY = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"


def teacher_path(cfg) -> str | None:
    return cfg.distillation.teacher_models.teacher_model.model_path if cfg.distillation.enabled else None


def load_teacher(cfg, device: torch.device):
    """(the frozen teacher, whole, on `device`, its precision): loaded as the reference is, from the teacher's
    path with the actor's model.* load arguments."""
    return load_reference(cfg, teacher_path(cfg), device, "ddp")


def teacher_forward(cfg) -> ForwardOptions:
    return dataclasses.replace(ForwardOptions.of(cfg), temperature=1.0, share_prompts=False, fused_head=False)


def vllm_teacher(cfg, path: str, device: torch.device, releases: ExitStack, holds_devices: bool = False):
    """The teacher's vLLM engine (workers/vllm_teacher.py), started, its close() in `releases`: its child process
    must end before the worker's, or vLLM's shared memory outlives the run (a process killed with its worker
    never unlinks it)."""
    from .vllm_teacher import VLLMTeacher

    engine = VLLMTeacher(cfg, path, device, holds_devices)
    releases.callback(engine.close)
    return engine


def teacher_engine(cfg) -> str:
    """inference.name, else the rollout's engine (verl's default), `auto` resolved as the rollout's is."""
    from ..rollout.engines import engine_class

    name = cfg.distillation.teacher_models.teacher_model.inference.name or cfg.actor_rollout_ref.rollout.name
    return engine_class(name).name if name == "auto" else name


def topk(cfg) -> int:
    """The teacher's top k a position for a top-k loss mode, else 0 (the sampled token's log-prob alone)."""
    lc = cfg.distillation.distillation_loss
    return lc.topk if lc.loss_mode in TOPK_MODES else 0


def as_fields(out, device: torch.device) -> dict[str, torch.Tensor]:
    """A teacher's answer (log-probs [B, R], or top-k log-probs and ids [B, R, K]) as the batch's fields on
    `device`."""
    if isinstance(out, tuple):
        return {"teacher_logp": out[0].to(device), "teacher_ids": out[1].to(device)}
    return {"teacher_logp": out.to(device)}


@dataclass(frozen=True)
class TeacherFields:
    """A teacher held here (`compute`: a batch -> its answer), answering with the batch's fields on `device`."""

    compute: Callable[[StepBatch], object]
    device: torch.device

    def __call__(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        return as_fields(self.compute(batch), self.device)


@dataclass(frozen=True)
class RemoteTeacher:
    """The teacher's pool: the samples cross in their CPU form to its worker, which answers for the teacher of
    routing key `key` (None: its one teacher)."""

    handle: object  # a TeacherWorker's Ray actor handle
    device: torch.device
    key: str | None = None

    def __call__(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        import ray

        fields = ray.get(self.handle.fields.remote(batch.only(), self.key))
        return {k: v.to(self.device) for k, v in fields.items()}


@dataclass(frozen=True)
class TeacherRouter:
    """Several teachers: each sample is scored by the one batch.teacher names (its index in `teachers`), their
    fields put back in row order; a teacher without samples in the batch is not asked."""

    teachers: tuple

    def __call__(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        for i, teacher in enumerate(self.teachers):
            rows = (batch.teacher == i).nonzero().squeeze(1)
            if len(rows) == 0:
                continue
            for k, v in teacher(batch.take(rows)).items():
                if k not in out:
                    out[k] = v.new_zeros((len(batch), *v.shape[1:]))
                out[k][rows.to(v.device)] = v
        return out


def hf_teacher(model, precision, forward: ForwardOptions, device: torch.device, cfg) -> Callable[[StepBatch], object]:
    """A whole hf teacher's answer to a batch, in micro batches of its own (no agreement with other workers, so
    workers may ask with different samples): log-probs [B, R], or top-k log-probs and ids [B, R, K], on the CPU."""
    micro = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    budget, k = batching.token_budgets(cfg)[MICRO_KEY], topk(cfg)
    if not k:
        return lambda batch: whole_model_logprobs(model, precision, forward, device, batch, micro, budget)

    def compute(batch: StepBatch) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = batch.input_ids.to(device), batch.attention_mask.to(device)
        parts = batching.plan(mask.sum(-1).tolist() if budget else [], 0, len(ids), micro, budget, lambda n: n)

        def part(p):  # log-probs and ids side by side, so the micro batches come back in row order at once
            with precision.autocast():
                logp, top = topk_token_logprobs(model, ids[p], mask[p], batch.prompt_len, forward, k)
            return torch.cat([logp.double(), top.double()], -1)  # ids below 2^53: exact in float64

        both = in_micro_batches(parts, part).cpu()
        return both[..., :k].float(), both[..., k:].long()

    return compute


def teacher_source(cfg, device: torch.device, pool, micro_batches, releases: ExitStack):
    """The teacher's fields of a batch (as_fields): from its pool (`pool`, a TeacherWorker's Ray handle), from a
    teacher held here (vLLM's in a child process, or the hf model), each sample from its own teacher where there are
    several (TeacherRouter), or None (distillation off). An engine started here is closed with `releases`, which
    the worker closes at shutdown."""
    if not cfg.distillation.enabled:
        return None
    found = teachers(cfg)
    if len(found) == 1:  # teacher_model, or one teacher named in its place
        return one_teacher(found[0].cfg, device, pool, micro_batches, releases)
    return TeacherRouter(tuple(one_teacher(t.cfg, device, pool, micro_batches, releases, t) for t in found))


def one_teacher(
    cfg, device: torch.device, pool, micro_batches, releases: ExitStack, teacher: Teacher | None = None
) -> Callable[[StepBatch], dict[str, torch.Tensor]]:
    """One teacher's source, `cfg` the run's config as it sees it; `teacher`: which of several (None: the one)."""
    if pool is not None:
        return RemoteTeacher(pool, device, None if teacher is None else teacher.key)
    if teacher_engine(cfg) == "vllm":
        return TeacherFields(vllm_teacher(cfg, teacher_path(cfg), device, releases), device)
    module, prec = load_teacher(cfg, device)
    if teacher is None and not topk(cfg):  # the one teacher's log-probs in the worker's agreed micro batches
        micro = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        return TeacherFields(LocalLogProbs(module, prec, micro, MICRO_KEY, teacher_forward(cfg), micro_batches), device)
    return TeacherFields(hf_teacher(module, prec, teacher_forward(cfg), device, cfg), device)


def teacher_choice(cfg, rows: list[dict], per_row: int) -> torch.Tensor | None:
    """[len(rows) * per_row]: which of several teachers (its index in config/teachers.teachers) scores each sample,
    `per_row` samples of each row in turn, by the row's distillation.teacher_key field; None with one teacher.
    A row whose value no teacher's key is stops the step in one line (the start-up check reads the training rows
    ahead)."""
    found = teachers(cfg) if cfg.distillation.enabled else []
    if len(found) < 2:
        return None
    field = cfg.distillation.teacher_key
    values = [r.get(field) for r in rows]
    why = route_refusal(cfg, values)
    if why:
        raise ConfigError(why)
    index = {t.key: i for i, t in enumerate(found)}
    return torch.tensor([index[str(v)] for v in values]).repeat_interleave(per_row)


def tokenizer_refusal(cfg, model_path: str) -> str | None:
    """Each teacher scores the student's token ids, so each must read them as the student does: the same
    vocabulary, ids and special tokens."""
    if not cfg.distillation.enabled:
        return None
    for t in teachers(cfg):
        why = one_tokenizer_refusal(t.cfg, model_path, t)
        if why:
            return why
    return None


def one_tokenizer_refusal(cfg, model_path: str, teacher: Teacher) -> str | None:
    """The student's tokenizer and that of `teacher` (`cfg`: the run as it sees it), and its vocabulary against
    the top-k mode's k."""
    from transformers import AutoTokenizer

    path, kw = teacher_path(cfg), load_kwargs(cfg.actor_rollout_ref.model)
    key = f"{teacher.prefix}.model_path={path}"
    try:
        theirs = AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{key}: its tokenizer does not load ({first}); name a model directory or a hub model"
    student = AutoTokenizer.from_pretrained(model_path, **kw)
    if student.get_vocab() != theirs.get_vocab() or student.all_special_ids != theirs.all_special_ids:
        return (
            f"{key}: its tokenizer is not the student's ({model_path}); the teacher scores the student's token ids, "
            "so both must share one tokenizer"
        )
    if topk(cfg) > len(theirs):
        return (
            f"distillation.distillation_loss.topk={topk(cfg)}: the teacher ({path}) has {len(theirs)} tokens; set "
            f"topk to {len(theirs)} or less"
        )
    return None


def devices_per_worker(cfg) -> int:
    """The devices each worker of the teacher's pool holds: a vLLM engine's inference.tensor_model_parallel_size
    (one engine over them, as a verl teacher replica), else 1 (the hf teacher, a whole copy per device). Named
    teachers: their largest (above 1 only where one teacher is named: config/distillation_checks.py)."""

    def one(view) -> int:
        inf = view.distillation.teacher_models.teacher_model.inference
        return inf.tensor_model_parallel_size if teacher_engine(view) == "vllm" else 1

    return max(one(t.cfg) for t in teachers(cfg))


class TeacherWorker(PoolWorker):
    """A worker of the teacher's own pool (distillation.nnodes > 0): a whole teacher on one device, or a vLLM engine
    over devices_per_worker(cfg) devices, computing the log-probs of the samples the training workers send it.
    Forward passes only, so no process group."""

    def __init__(self, cfg_dict: dict, model_path: str | None, use_gpu: bool, rank: int = 0):
        """model_path: the teacher's (None where teachers are named: each its own); rank: this worker's place in the
        pool. With named teachers, this worker holds each as a worker of its own would, by routing key."""
        cfg = from_dict(cfg_dict)
        determinism.engine_env(cfg, "cuda" if use_gpu else "cpu")  # a vLLM teacher starts with it
        self.by_key, self.releases = None, ExitStack()
        if cfg.distillation.teacher_models.named:
            found = teachers(cfg)
            self.by_key = {t.key: TeacherWorker(t.cfg.to_dict(), teacher_path(t.cfg), use_gpu, rank) for t in found}
            for each in self.by_key.values():
                self.releases.callback(each.shutdown)
            return
        ensure_local_embedded_model(model_path)
        if teacher_engine(cfg) == "vllm":
            torch.set_num_threads(1)
            # the engine's processes hold the devices; this worker only passes samples and log-probs along
            self.device = torch.device("cpu")
            engine_on = torch.device("cuda" if use_gpu else "cpu")
            self.compute = vllm_teacher(cfg, model_path, engine_on, self.releases, holds_devices=True)
            return
        self.device = single_device(use_gpu)
        model, precision = load_reference(cfg, model_path, self.device, "ddp")
        self.compute = hf_teacher(model, precision, teacher_forward(cfg), self.device, cfg)

    @torch.no_grad()
    def fields(self, batch: StepBatch, key: str | None = None) -> dict[str, torch.Tensor]:
        """The teacher's fields of the batch (as_fields), on the CPU for the trip back; `key`: the teacher's routing
        key where this worker holds several."""
        if self.by_key is not None:  # one named teacher answers whatever the key, as verl's one teacher
            return (self.by_key[key] if len(self.by_key) > 1 else next(iter(self.by_key.values()))).fields(batch)
        return as_fields(self.compute(batch), torch.device("cpu"))

    def shutdown(self) -> None:
        self.releases.close()
