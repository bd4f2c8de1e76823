"""What the driver's stages hand each other (driver/train.py): `Prepared`, what prepare makes before any worker
exists, and `Progress`, where the loop stands. The workers and the mode that start adds are train.Started."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..data.custom_sampler import CustomSampler
from ..data.sampler import Sampler
from .faults import Injected


@dataclass(frozen=True)
class Prepared:
    """The run as prepare leaves it: the resolved config (the workers' learning-rate schedules' step count and the
    device filled in), the model, the data and the run's length. Every check that needs no worker has passed. The
    sampler and the KL controller are the run's own and change as it goes; the fields never do."""

    cfg: object
    model_path: str
    rm_path: str | None
    adapter: dict | None  # the LoRA adapter's shape (lora.check), which a resume must match and export rebuilds
    train_rows: list[dict]
    val_rows: list[dict]
    sampler: Sampler | CustomSampler
    kl_ctrl: object
    out: Path
    resume_from: Path | None
    faults: Injected  # RLRIG_FAULT_HANG's (tests)
    pad_id: int  # the tokenizer's padding token (its EOS where it has none), as the workers pad
    total: int  # steps in the run: updates, or weight versions in the fully async mode
    updates: int  # updates in the run (the workers' learning-rate schedules count them)


@dataclass
class Progress:
    """Where the loop stands: `step`, the step in hand (between steps, the last one trained), and `ahead_from`, where
    the data stood after the step's batch when the next batch is already drawn and generating (one step off-policy;
    None otherwise). A checkpoint of the step records that place, so a resumed run draws the next batch again."""

    step: int = 0
    ahead_from: tuple[int, int] | None = None

    def data_at(self, sampler: Sampler | CustomSampler) -> tuple[int, int]:
        """(epoch, position) of the data after the step's batch: what a checkpoint of this step records."""
        return self.ahead_from or (sampler.epoch, sampler.pos)
