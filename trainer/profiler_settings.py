"""The profiler settings each role gets from the config (verl's global_profiler.*, each role's profiler.*), with
verl's ${oc.select:global_profiler...} defaults resolved, and the tools global_profiler.tool names: what config
validation checks and what workers/profiling.py records with."""

from __future__ import annotations

from dataclasses import dataclass

# each role's profiler section, in the order verl starts them (ray_trainer.py:1054-1063)
ROLE_KEYS = {
    "actor": "actor_rollout_ref.actor",
    "ref": "actor_rollout_ref.ref",
    "critic": "critic",
    "reward_model": "reward_model",
}
TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack", "profile-by-stage", "merge-profiles")  # verl config.py:48
# global_profiler.tool's choices, in the order rlrig lists them, and whether each records a run on CPU (nsys and
# torch_memory record CUDA work only); workers/profiling.py implements one Tool class per name
TOOL_RECORDS_CPU = {"torch": True, "nsys": False, "torch_memory": False}


@dataclass(frozen=True)
class RoleProfile:
    """A role's profiler settings with verl's ${oc.select:global_profiler...} defaults resolved."""

    enable: bool
    all_ranks: bool
    ranks: tuple[int, ...]
    save_path: str
    discrete: bool  # of the run's tool
    contents: tuple[str, ...]  # torch's
    max_entries: int  # torch_memory's
    stack_depth: int
    # torch's schedule over the update's mini batches (skip_first, wait, warmup, active, repeat); None: active=0,
    # every mini batch recorded
    schedule: tuple[int, int, int, int, int] | None = None

    def chooses(self, rank: int) -> bool:
        """verl's DistProfiler (profile.py:100-108): when enabled, every rank, the listed ones, or rank 0."""
        return self.enable and (self.all_ranks or (rank in self.ranks if self.ranks else rank == 0))


def role_profile(cfg, role: str) -> RoleProfile:
    g, section = cfg.global_profiler, cfg
    for part in f"{ROLE_KEYS[role]}.profiler".split("."):
        section = getattr(section, part)
    # the reward model's tool_config is the actor's (verl's default, and the only one rlrig takes)
    tc = (cfg.actor_rollout_ref.actor.profiler if role == "reward_model" else section).tool_config
    nsys_discrete = g.global_tool_config.nsys.discrete if tc.nsys.discrete is None else tc.nsys.discrete
    mem = g.global_tool_config.torch_memory
    return RoleProfile(
        enable=section.enable,
        all_ranks=section.all_ranks,
        ranks=tuple(section.ranks),
        save_path=section.save_path or g.save_path,
        discrete={"torch": tc.torch.discrete, "nsys": nsys_discrete}.get(g.tool, False),
        contents=tuple(tc.torch.contents),
        max_entries=tc.torch_memory.trace_alloc_max_entries or mem.trace_alloc_max_entries,
        stack_depth=tc.torch_memory.stack_depth or mem.stack_depth,
        schedule=torch_schedule(tc.torch.schedule),
    )


def torch_schedule(s) -> tuple[int, int, int, int, int] | None:
    """verl's TorchProfilerScheduleConfig as torch.profiler.schedule's arguments in order; None where active=0
    (verl's `enabled`: no schedule)."""
    return (s.skip_first, s.wait, s.warmup, s.active, s.repeat) if s.active > 0 else None


ROLLOUT_KEY = "actor_rollout_ref.rollout.profiler"


@dataclass(frozen=True)
class RolloutProfile:
    """actor_rollout_ref.rollout.profiler with verl's defaults resolved (its nulls: the actor's enable, all_ranks,
    ranks and torch tool_config; global_profiler's tool and save_path): the rollout engines' own recording of the
    gen phase (verl vllm_async_server.py:182-204, 894-912). verl records it only with the torch tool in discrete
    mode (_should_profile), one folder per engine replica (config.py rollout_trace_dir)."""

    enable: bool
    tool: str | None
    all_ranks: bool
    ranks: tuple[int, ...]
    save_path: str
    discrete: bool
    contents: tuple[str, ...]
    token_start: int | None  # the engine step its recording begins at (profile_token_start); None: the first
    token_end: int | None  # the engine step it ends before (profile_token_end); None: the last

    @property
    def records(self) -> bool:
        """Whether the engines record at all: enabled, torch, discrete (verl's _should_profile)."""
        return self.enable and self.tool == "torch" and self.discrete

    def chooses(self, replica: int, replica_size: int) -> bool:
        """Whether engine replica `replica` (of replica_size workers) records: `ranks` are workers' ranks, each
        choosing the replica that holds it; [] the replica of rank 0 (verl profile.py build_rollout_dist_profiler)."""
        if not self.records:
            return False
        if self.all_ranks:
            return True
        return replica in {r // replica_size for r in self.ranks} if self.ranks else replica == 0

    def folder(self, replica: int) -> str:
        """Where replica `replica`'s traces go (verl config.py rollout_trace_dir)."""
        return f"{self.save_path}/agent_loop_rollout_replica_{replica}"


def rollout_profile(cfg) -> RolloutProfile:
    r, actor, g = cfg.actor_rollout_ref.rollout.profiler, cfg.actor_rollout_ref.actor.profiler, cfg.global_profiler
    t, at = r.tool_config.torch, actor.tool_config.torch

    def own(value, default):
        return default if value is None else value

    return RolloutProfile(
        enable=own(r.enable, actor.enable),
        tool=own(r.tool, g.tool),
        all_ranks=own(r.all_ranks, actor.all_ranks),
        ranks=tuple(own(r.ranks, actor.ranks)),
        save_path=own(r.save_path, g.save_path),
        discrete=own(t.discrete, at.discrete),
        contents=tuple(own(t.contents, at.contents)),
        token_start=t.profile_token_start,
        token_end=t.profile_token_end,
    )
