"""The rollout profiler (actor_rollout_ref.rollout.profiler): each generation of a recorded step (global_profiler.steps)
recorded by the engine's own profiler, on the workers of the engine replicas its ranks choose, as verl's replicas
start and stop their engines' profilers around the step's generate_sequences (ray_trainer.py:1511-1516,
vllm_async_server.py:894-912). Where the traces go (verl's layout; N: the step, a second generation of the step
such as ReMax's greedy one _call2):

  hf       {save_path}/agent_loop_rollout_replica_{replica}/stepN_prof_rank-{rank}.json.gz (torch.profiler)
  vllm     {save_path}/agent_loop_rollout_replica_{replica}/, vLLM's own names, one per rank of the engine
  sglang   {save_path}/agent_loop_rollout_replica_{replica}/, SGLang's own names

A replica is the workers of one engine (rollout.tensor_model_parallel_size of them); every worker of a chosen
replica records."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

from ..profiler_settings import rollout_profile
from ..rollout.engines.recording import EngineRecording

# rlrig's phases that generate with the engine: the step's samples, and ReMax's greedy ones (verl asks for both in
# one request, within one recording)
GENERATIONS = ("gen", "gen_max")


def engine_recording(cfg, rank: int) -> EngineRecording | None:
    """What the engine of the worker of `rank` records with, or None where the rollout profiler does not choose its
    replica (or records nothing: not enabled, not torch, not discrete)."""
    p = rollout_profile(cfg)
    size = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
    if not cfg.global_profiler.steps or not p.chooses(rank // size, size):
        return None
    return EngineRecording(p.folder(rank // size), rank, p.contents, p.token_start, p.token_end)


class RolloutRecorder:
    """The rollout profiler on one worker whose engine was built with a recording (engine_recording): `generation`
    brackets one generation of a recorded step with the engine's start_profile and stop_profile."""

    def __init__(self, engine):
        self.engine = engine
        self.calls: Counter = Counter()  # the generations recorded per step

    @contextlib.contextmanager
    def generation(self, step: int) -> Iterator[None]:
        self.calls[step] += 1
        k = self.calls[step]
        self.engine.start_profile(f"step{step}" + (f"_call{k}" if k > 1 else ""))
        try:
            yield
        finally:
            self.engine.stop_profile()
