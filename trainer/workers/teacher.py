"""The distillation teacher (distillation.enabled): its log-probs of the student's sampled tokens, from the hf
engine's forward pass over prompt and response or vLLM's prompt log-probs (inference.name, verl's default the
rollout's engine: workers/vllm_teacher.py), at temperature 1 as verl's teacher computes them (prompt log-probs are
a forward pass: verl sets its teacher's temperature to 1 whatever the rollout's). Where it runs is
chosen once (teacher_source): a whole copy held in every training worker (distillation.nnodes=0), or a pool of its
own (TeacherWorker, nnodes x n_gpus_per_node workers) that the training workers send their samples to, as the
reference's pool."""

from __future__ import annotations

import dataclasses

import torch

from ..batch.step_batch import StepBatch
from ..config.schema import from_dict
from ..model import micro_batches as batching
from ..model.build import load_kwargs, load_reference
from ..model.forward import ForwardOptions
from .base import PoolWorker, ensure_local_embedded_model, single_device, whole_model_logprobs
from .step.sources import LocalLogProbs, RemoteLogProbs

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


def teacher_engine(cfg) -> str:
    """inference.name, else the rollout's engine (verl's default), `auto` resolved as the rollout's is."""
    from ..rollout.engines import engine_class

    name = cfg.distillation.teacher_models.teacher_model.inference.name or cfg.actor_rollout_ref.rollout.name
    return engine_class(name).name if name == "auto" else name


def teacher_source(cfg, device: torch.device, pool, micro_batches):
    """The teacher's log-probs [B, R]: from its pool (`pool`, a TeacherWorker's Ray handle), from a teacher held
    here (vLLM's in a child process, or the hf model), or None (distillation off)."""
    if not cfg.distillation.enabled:
        return None
    if pool is not None:
        return RemoteLogProbs(pool, device)
    if teacher_engine(cfg) == "vllm":
        from .vllm_teacher import VLLMTeacher

        return VLLMTeacher(cfg, teacher_path(cfg), device)
    module, prec = load_teacher(cfg, device)
    micro = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
    return LocalLogProbs(module, prec, micro, MICRO_KEY, teacher_forward(cfg), micro_batches)


def tokenizer_refusal(cfg, model_path: str) -> str | None:
    """The teacher scores the student's token ids, so both must read them alike: the same vocabulary, ids and
    special tokens."""
    path = teacher_path(cfg)
    if path is None:
        return None
    from transformers import AutoTokenizer

    kw = load_kwargs(cfg.actor_rollout_ref.model)
    key = f"distillation.teacher_models.teacher_model.model_path={path}"
    try:
        teacher = AutoTokenizer.from_pretrained(path, **kw)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"{key}: its tokenizer does not load ({first}); name a model directory or a hub model"
    student = AutoTokenizer.from_pretrained(model_path, **kw)
    same = student.get_vocab() == teacher.get_vocab() and student.all_special_ids == teacher.all_special_ids
    if same:
        return None
    return (
        f"{key}: its tokenizer is not the student's ({model_path}); the teacher scores the student's token ids, "
        "so both must share one tokenizer"
    )


def devices_per_worker(cfg) -> int:
    """The devices each worker of the teacher's pool holds: a vLLM engine's inference.tensor_model_parallel_size
    (one engine over them, as a verl teacher replica), else 1 (the hf teacher, a whole copy per device)."""
    inf = cfg.distillation.teacher_models.teacher_model.inference
    return inf.tensor_model_parallel_size if teacher_engine(cfg) == "vllm" else 1


class TeacherWorker(PoolWorker):
    """A worker of the teacher's own pool (distillation.nnodes > 0): a whole teacher on one device, or a vLLM engine
    over devices_per_worker(cfg) devices, computing the log-probs of the samples the training workers send it.
    Forward passes only, so no process group."""

    def __init__(self, cfg_dict: dict, model_path: str, use_gpu: bool, rank: int = 0):
        """model_path: the teacher's; rank: this worker's place in the pool."""
        cfg = from_dict(cfg_dict)
        ensure_local_embedded_model(model_path)
        if teacher_engine(cfg) == "vllm":
            from .vllm_teacher import VLLMTeacher

            torch.set_num_threads(1)
            # the engine's processes hold the devices; this worker only passes samples and log-probs along
            self.device = torch.device("cpu")
            engine_on = torch.device("cuda" if use_gpu else "cpu")
            self.compute = VLLMTeacher(cfg, model_path, engine_on, holds_devices=True)
            return
        self.device = single_device(use_gpu)
        model, precision = load_reference(cfg, model_path, self.device, "ddp")
        micro = cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        forward, budget = teacher_forward(cfg), batching.token_budgets(cfg)[MICRO_KEY]
        self.compute = lambda batch: whole_model_logprobs(model, precision, forward, self.device, batch, micro, budget)

    @torch.no_grad()
    def logprobs(self, batch: StepBatch) -> torch.Tensor:
        """[B, R] log-probs of the response tokens, on the CPU for the trip back."""
        return self.compute(batch).cpu()
