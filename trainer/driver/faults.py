"""Injected hangs, for testing the watchdog (off unless set): `RLRIG_FAULT_HANG=RANK:PHASE:STEP` makes training
worker RANK hang in phase PHASE (a timing_s/* name) at global step STEP (PHASE=rollout_gen: rollout worker RANK, in
generating step STEP's batch); `PHASE=collective` makes it stay out of
the update's collectives at that step, so its peers block inside the first one. Several, comma-separated, hang
at their own steps. Each fires once per run directory: a marker file there records it, so a restarted run goes on
past it."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..workers.timing import PHASES
from .reporting import say

ENV = "RLRIG_FAULT_HANG"
KINDS = (*PHASES, "collective")


@dataclass(frozen=True)
class FaultHang:
    rank: int
    phase: str
    step: int

    def marker(self, out: Path) -> Path:
        return out / f".fault-hang-{self.rank}-{self.phase}-{self.step}"


def from_env(world: int, rollout_world: int = 0, env=os.environ) -> list[FaultHang]:
    """world: the training workers; rollout_world: the rollout pool's (0: none)."""
    text = env.get(ENV, "")
    usage = (
        f"{ENV}={text}: expected RANK:PHASE:STEP[,...] with RANK below {world} (below {rollout_world} for "
        f"rollout_gen), PHASE one of {', '.join(KINDS)}, STEP from 1"
    )
    faults = []
    for spec in filter(None, text.split(",")):
        parts = spec.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[2].isdigit() or parts[1] not in KINDS:
            raise ConfigError(usage)
        fault = FaultHang(int(parts[0]), parts[1], int(parts[2]))
        if fault.rank >= (rollout_world if fault.phase == "rollout_gen" else world) or fault.step < 1:
            raise ConfigError(usage)
        faults.append(fault)
    return faults


def due(faults: list[FaultHang], step: int, out: Path) -> list[FaultHang]:
    """The faults that fire at `step`: theirs, and not fired in this run directory before. Records them."""
    fire = [f for f in faults if f.step == step and not f.marker(out).exists()]
    for f in fire:
        f.marker(out).touch()
    return fire


@dataclass(frozen=True)
class Injected:
    """A run's faults and the run directory whose markers record which fired. The driver arms a step's training
    faults before its update starts, and a batch's rollout_gen faults before the rollout pool starts generating it."""

    hangs: tuple[FaultHang, ...]
    out: Path

    def arm_training(self, step: int, training: list) -> None:
        """The training ranks' faults due at `step`, armed on their workers (Ray handles, by rank)."""
        for fault in due([f for f in self.hangs if f.phase != "rollout_gen"], step, self.out):
            say(f"{ENV}: rank {fault.rank} hangs in {fault.phase} at step {step}")
            training[fault.rank].arm_fault.remote(fault.phase)

    def arm_rollout(self, step: int, rollout: list) -> None:
        """The rollout_gen faults of the batch of `step`, armed on the rollout pool's workers (Ray handles)."""
        for fault in due([f for f in self.hangs if f.phase == "rollout_gen"], step, self.out):
            say(f"{ENV}: rollout {fault.rank} hangs in rollout_gen at step {step}")
            rollout[fault.rank].arm_fault.remote(fault.phase)
