"""How the rollout profiler (actor_rollout_ref.rollout.profiler, profiler_settings.RolloutProfile) asks an engine to
record its generations: the settings each engine's own profiler takes, as verl converts them
(verl/utils/profiler/config.py build_vllm_profiler_args, build_sglang_profiler_args), and torch.profiler in this
process for an engine that generates in it (hf)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class EngineRecording:
    """What one worker's engine records with: the folder its traces go to (verl's
    {save_path}/agent_loop_rollout_replica_{replica}), the worker's rank, torch's contents, and the window of engine
    steps (profile_token_start, profile_token_end; None: from the first, to the last)."""

    folder: str
    rank: int
    contents: tuple[str, ...] = ()
    token_start: int | None = None
    token_end: int | None = None

    @property
    def with_stack(self) -> bool:
        return "stack" in self.contents or "module" in self.contents

    @property
    def record_shapes(self) -> bool:
        return "shapes" in self.contents

    @property
    def with_memory(self) -> bool:
        return "memory" in self.contents

    @property
    def windowed(self) -> bool:
        return self.token_start is not None or self.token_end is not None

    def vllm_config(self) -> dict:
        """vLLM's profiler_config (its engine argument since 0.13): a start and stop of the engine's torch profiler
        write a trace per rank into the folder; the window as delay_iterations and max_iterations (0: no bound)."""
        delay = self.token_start or 0
        return {
            "profiler": "torch",
            "torch_profiler_dir": str(Path(self.folder).absolute()),
            "torch_profiler_with_memory": self.with_memory,
            "torch_profiler_with_stack": self.with_stack,
            "torch_profiler_record_shapes": self.record_shapes,
            "delay_iterations": delay,
            "max_iterations": self.token_end - delay if self.token_end is not None else 0,
            "ignore_frontend": True,
        }

    def sglang_args(self) -> dict:
        """SGLang's Engine.start_profile arguments (its ProfileReq); it records no memory."""
        start = self.token_start
        return {
            "output_dir": self.folder,
            "with_stack": self.with_stack,
            "record_shapes": self.record_shapes,
            "start_step": start,
            "num_steps": self.token_end - (start or 0) if self.token_end is not None else None,
        }


class TorchRecording:
    """torch.profiler over this process from start to stop, its chrome trace written to
    {folder}/{name}_prof_rank-{rank}.json.gz when it stops (the name a worker's own torch profiler gives its traces).
    A process runs one torch profiler at a time: the caller starts it where no other is recording."""

    def __init__(self, rec: EngineRecording, device_type: str):
        self.rec, self.device_type = rec, device_type
        self.prof: torch.profiler.profile | None = None
        self.path: Path | None = None

    def start(self, name: str) -> None:
        self.path = Path(self.rec.folder) / f"{name}_prof_rank-{self.rec.rank}.json.gz"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        contents, acts = set(self.rec.contents), []
        if not contents or "cpu" in contents:
            acts.append(torch.profiler.ProfilerActivity.CPU)
        if (not contents or "cuda" in contents) and self.device_type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(
            activities=acts,
            with_stack=self.rec.with_stack,
            record_shapes=self.rec.record_shapes,
            profile_memory=self.rec.with_memory,
        )
        self.prof.start()

    def stop(self) -> None:
        prof, self.prof = self.prof, None
        prof.stop()
        prof.export_chrome_trace(str(self.path))
