"""verl's curriculum samplers (data.sampler.class_path naming a sampler with update(batch)): after each step the
driver gathers the step's samples from the training workers and hands them to the sampler, as verl's trainer hands
its batch. The batch is verl's DataProto where verl is installed (a sampler built on verl's
AbstractCurriculumSampler needs it anyway), else StepData, which reads alike: `batch` (the tensors by verl's names),
`non_tensor_batch` (each sample's row fields and `uid`, as numpy object arrays) and `meta_info`.

The fully async mode draws its prompts one at a time ahead of the updates and has no step batch to hand over: it
refuses a curriculum sampler at start-up."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..config.overrides import FULLY_ASYNC
from ..errors import ConfigError
from ..rollout.engines.base import left_pad_to


@dataclass
class StepData:
    """The step's batch as verl's DataProto holds it, for reading (update's argument where verl is not installed)."""

    batch: dict[str, torch.Tensor]
    non_tensor_batch: dict[str, np.ndarray]
    meta_info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.batch["input_ids"])


def check(cfg, sampler) -> None:
    if sampler.curriculum and cfg.trainer.async_mode == FULLY_ASYNC:
        raise ConfigError(
            f"data.sampler.class_path/class_name: {sampler.name} is a curriculum sampler (it has update(batch)); the "
            "fully async mode draws prompts ahead of its updates and has no step batch to hand it: use one step off-"
            "policy or the synchronous mode, or a sampler without update"
        )


def _widened(p: dict, key: str, prompt: int, response: int, pad_id: int) -> torch.Tensor:
    """A worker's field widened to the batch's widest prompt (more padding on the left) and response (on the right);
    token ids padded with pad_id, the rest with 0."""
    t, fill = p[key], pad_id if key in ("input_ids", "prompts", "responses") else 0
    if t.dim() == 1:
        return t
    right = lambda r: torch.nn.functional.pad(r, (0, response - r.shape[1]), value=fill)
    if key in ("input_ids", "attention_mask"):  # prompt, then response, columns
        cut = p["prompt_len"]
        return torch.cat([left_pad_to(t[:, :cut], prompt, fill), right(t[:, cut:])], dim=1)
    return left_pad_to(t, prompt, fill) if key == "prompts" else right(t)


def step_data(parts: list[dict | None], rows: list[dict], step: int, pad_id: int) -> StepData:
    """The workers' kept samples (TrainingWorker.kept_batch) as one batch: prompts left-padded and responses
    right-padded to the widest, each sample with the fields of its prompt's row (`rows`: the step's prompts in the
    order the workers' shares were cut from)."""
    parts = [p for p in parts if p is not None]
    prompt = max(p["prompt_len"] for p in parts)
    response = max(p["responses"].shape[1] for p in parts)
    tensors = {
        key: torch.cat([_widened(p, key, prompt, response, pad_id) for p in parts])
        for key in parts[0]
        if key != "prompt_len"
    }
    group = tensors.pop("group").tolist()
    non_tensor = {"uid": np.array([f"{step}-{g}" for g in group], dtype=object)}
    for key in sorted({k for r in rows for k in r}):
        values = np.empty(len(group), dtype=object)
        values[:] = [rows[g].get(key) for g in group]
        non_tensor[key] = values
    return StepData(tensors, non_tensor, {"global_steps": step})


def as_verls(data: StepData):
    """verl's DataProto of the same batch where verl is installed, else the StepData itself."""
    try:
        from verl import DataProto
    except ImportError:
        return data
    return DataProto.from_dict(tensors=data.batch, non_tensors=data.non_tensor_batch, meta_info=data.meta_info)


def hand_over(sampler, training: list, rows: list[dict], step: int, pad_id: int) -> None:
    """After step `step` trained with keep: its samples, kept by the training workers, to the curriculum sampler's
    update, as verl calls it (`rows`: the step's prompts)."""
    import ray

    parts = ray.get([w.kept_batch.remote() for w in training])
    sampler.user.update(batch=as_verls(step_data(parts, rows, step, pad_id)))
