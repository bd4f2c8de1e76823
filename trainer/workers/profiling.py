"""verl's profilers (global_profiler.*, each role's profiler.*): the steps of global_profiler.steps recorded by the
workers whose rank a role they hold chooses, with the tool global_profiler.tool names.

The driver opens and closes windows of steps (StepWindows, as verl's ray_trainer.py fit:1350-1370, 1657-1669) on
every worker; a worker's WorkerProfiler starts and stops its tool there and brackets each phase of the step
(verl's DistProfiler.annotate). A process records when one of the roles it holds chooses its rank (verl's
colocated roles share one process and its one profiler, verl/utils/profiler/torch_profile.py:105-128). One class
per tool, registered by name. Where the files go (save_path: the role's, else global_profiler.save_path; N: the
step the recording began at):

  torch                 {save_path}/{e2e|critic|ref|reward_model}/stepN_prof_rank-{rank}.json.gz, a window
  torch, discrete       {save_path}/{verl's name of the call}/stepN_prof_rank-{rank}.json.gz, a phase (PHASES)
  torch_memory          {save_path}/stepN/torch_memory_rank{rank}_pid{pid}.pickle, a window; and after every step's
                        update, on each training worker, {save_path}/stepN/post_update_stepN_rank{rank}_pid{pid}.pickle
  nsys                  Nsight Systems reports in Ray's session logs (logs/nsight), one per worker process
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from ..profiler_settings import TOOL_RECORDS_CPU, RoleProfile, role_profile
from .rollout_profiling import GENERATIONS, RolloutRecorder

# rlrig's phases that verl records as worker calls of their own (DistProfiler.annotate's role, verl
# fsdp_workers.py:892, 938, 988, 1040, 1539, 1559, 1927): the role whose profiler records the phase, and the
# folder of its trace in discrete mode. ReMax's greedy generation is a second generate call of the step.
PHASES = {
    "gen": ("actor", "rollout_generate"),
    "gen_max": ("actor", "rollout_generate_max"),
    "old_log_prob": ("actor", "actor_compute_log_prob"),
    "update_actor": ("actor", "actor_update"),
    "ref": ("ref", "ref_compute_log_prob"),
    "values": ("critic", "compute_values"),
    "update_critic": ("critic", "critic_update"),
    "reward": ("reward_model", "compute_rm_score"),
}
# --- the tools ---


class Tool:
    """What a tool does in one worker process: begin and end a recording (a window of steps, or one phase in
    discrete mode) and mark a named range inside one. `first`: the settings of the first role the process holds."""

    name = ""
    records_phases = True  # discrete mode records each phase alone; False: windows only

    def __init__(self, rank: int, device: torch.device, first: RoleProfile):
        self.rank, self.device = rank, device

    def begin(self, profile: RoleProfile, folder: str, stem: str) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError

    def mark(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


TOOLS: dict[str, type[Tool]] = {}


def register_tool(name: str):
    """Registers a Tool class as global_profiler.tool=`name`, one of profiler_settings.TOOL_RECORDS_CPU, the names
    config validation accepts and the devices it allows them on."""
    if name not in TOOL_RECORDS_CPU:
        raise ValueError(f"profiler tool {name!r}: add it to profiler_settings.TOOL_RECORDS_CPU first")

    def add(cls: type[Tool]) -> type[Tool]:
        cls.name = name
        TOOLS[name] = cls
        return cls

    return add


# the process's running torch profiler with a schedule, which the update's mini batches advance (torch.profiler is
# process-wide, as verl's Profiler._active_prof)
_SCHEDULED: list[torch.profiler.profile] = []
UPDATE_FOLDERS = ("actor_update", "critic_update")  # discrete mode: the phases the schedule applies to


def mini_batch_done() -> None:
    """After each mini batch of the actor's or critic's update: a scheduled torch profiler moves one step, as verl's
    DistProfiler.step (nothing otherwise)."""
    if _SCHEDULED:
        _SCHEDULED[0].step()


@register_tool("torch")
class TorchTool(Tool):
    """torch.profiler, its chrome trace written when the recording ends (verl torch_profile.py). With a schedule
    (profiler.tool_config.torch.schedule, active > 0) the update's mini batches walk it: a window of steps records
    every phase before the update and then the mini batches the schedule keeps (repeat 0 is one window there, as
    verl's); in discrete mode the update's own trace is scheduled, the other phases' are whole. A schedule's later
    windows go to files of their own (_part1, _part2, ...)."""

    prof = None

    def begin(self, profile: RoleProfile, folder: str, stem: str) -> None:
        path = Path(profile.save_path) / folder / f"{stem}_prof_rank-{self.rank}"
        path.parent.mkdir(parents=True, exist_ok=True)
        contents, acts = set(profile.contents), []
        if not contents or "cpu" in contents:
            acts.append(torch.profiler.ProfilerActivity.CPU)
        if (not contents or "cuda" in contents) and self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        schedule = profile.schedule if not profile.discrete or folder in UPDATE_FOLDERS else None
        windows = []

        def write(prof) -> None:
            windows.append(path)
            prof.export_chrome_trace(f"{path}{f'_part{len(windows) - 1}' if len(windows) > 1 else ''}.json.gz")

        kw = {}
        if schedule is not None:
            skip_first, wait, warmup, active, repeat = schedule
            repeat = repeat or (0 if profile.discrete else 1)
            kw["schedule"] = torch.profiler.schedule(
                wait=wait, warmup=warmup, active=active, repeat=repeat, skip_first=skip_first
            )
        self.prof = torch.profiler.profile(
            activities=acts,
            with_stack="stack" in contents,
            record_shapes="shapes" in contents,
            profile_memory="memory" in contents,
            on_trace_ready=write,
            **kw,
        )
        if schedule is not None:
            self.prof.record_steps = False  # a step is a mini batch: torch's ProfilerStep#n rows would only add noise
            _SCHEDULED[:] = [self.prof]
        self.prof.start()

    def end(self) -> None:
        if self.prof in _SCHEDULED:
            _SCHEDULED.clear()
        else:
            self.prof.step()
        self.prof.stop()
        self.prof = None

    def mark(self, name: str) -> contextlib.AbstractContextManager:
        return torch.profiler.record_function(name)


@register_tool("nsys")
class NsysTool(Tool):
    """Nsight Systems, which Ray's runtime_env wraps around the worker (nsight_runtime_env): it captures between
    torch.cuda.profiler.start and stop, phases as NVTX ranges (verl nvtx_profile.py:114-182)."""

    def begin(self, profile: RoleProfile, folder: str, stem: str) -> None:
        torch.cuda.profiler.start()

    def end(self) -> None:
        torch.cuda.profiler.stop()

    def mark(self, name: str) -> contextlib.AbstractContextManager:
        return torch.cuda.nvtx.range(name)


@register_tool("torch_memory")
class TorchMemoryTool(Tool):
    """CUDA memory history, recorded from the worker's start and dumped as a snapshot (memory_viz's pickle) when a
    recording ends (verl profile.py:200-272, memory_utils.py:146-290). It has no discrete mode."""

    records_phases = False
    dest: Path | None = None

    def __init__(self, rank: int, device: torch.device, first: RoleProfile):
        super().__init__(rank, device, first)
        record = torch.cuda.memory._record_memory_history
        kwargs = dict(context="all", stacks="all", max_entries=first.max_entries)
        if "stack_depth" in inspect.signature(record).parameters:
            kwargs["stack_depth"] = first.stack_depth
        record(**kwargs)

    def begin(self, profile: RoleProfile, folder: str, stem: str) -> None:
        self.dest = self.snapshot_path(profile.save_path, stem, "torch_memory")

    def end(self) -> None:
        self.dump(self.dest)

    def snapshot_path(self, save_path: str, stem: str, tag: str) -> Path:
        return Path(save_path) / stem / f"{tag}_rank{self.rank}_pid{os.getpid()}.pickle"

    def dump(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.synchronize(self.device)
        torch.cuda.memory._dump_snapshot(str(path))


# --- a worker's profiler ---


class WorkerProfiler:
    """The profiler of one worker process. `roles` maps each role whose phases run here to the role whose profiler
    settings record them (the reference inside a LoRA actor is the actor's), in verl's start order; `folder` names
    the process's window traces. `rollout`: the rollout profiler where it records this worker's engine
    (workers/rollout_profiling.py), which then records the generations of the step in place of this profiler (a
    process runs one torch profiler at a time; verl's training workers never hold the generation): a window's
    recording closes before one and the next phase opens the rest, named after its step."""

    def __init__(
        self, tool: Tool | None, rank: int, roles: dict[str, RoleProfile], folder: str, rollout: RolloutRecorder = None
    ):
        self.tool, self.rank, self.roles, self.folder, self.rollout = tool, rank, roles, folder, rollout
        chosen = [p for p in roles.values() if p.chooses(rank)]
        self.window = chosen[0] if chosen and tool is not None else None  # the profile the first chooser gives
        self.discrete = self.window is not None and self.window.discrete and tool.records_phases
        self.step: int | None = None  # the step being recorded; None: not recording
        self.open = False  # the window's recording is running
        self.calls: Counter = Counter()  # a discrete trace's calls per folder within the step

    def start(self, step: int) -> None:
        """Before each recorded step: the first of a window begins the recording, named after it (where the rollout
        profiler records the step's first phase, generation, after that)."""
        if self.window is None and self.rollout is None:
            return
        self.step, self.calls = step, Counter()
        if self.rollout is None:
            self._open()

    def _open(self) -> None:
        if self.window is not None and not self.discrete and not self.open:
            self.tool.begin(self.window, self.folder, f"step{self.step}")
            self.open = True

    def _close(self) -> None:
        if self.open:
            self.tool.end()
            self.open = False

    def stop(self) -> None:
        self._close()
        self.step = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """A phase of the step: a named range of the window's recording, or in discrete mode a recording of its
        own when its role chooses this rank (a phase run again in the step: `stepN_callK`); a generation, where the
        rollout profiler records it, that profiler's recording alone."""
        if self.step is None:
            yield
            return
        if self.rollout is not None and name in GENERATIONS:
            self._close()
            with self.rollout.generation(self.step):
                yield
            return
        if self.window is None:
            yield
            return
        if not self.discrete:
            self._open()
            with self.tool.mark(name):
                yield
            return
        role, folder = PHASES.get(name, (None, None))
        profile = self.roles.get(role)
        if profile is None or not profile.chooses(self.rank):
            yield
            return
        self.calls[folder] += 1
        k = self.calls[folder]
        self.tool.begin(profile, folder, f"step{self.step}" + (f"_call{k}" if k > 1 else ""))
        try:
            with self.tool.mark(name):
                yield
        finally:
            self.tool.end()

    def after_update(self, step: int) -> None:
        """torch_memory: each training worker's snapshot after the step's update, whatever the steps and ranks
        (verl ray_trainer.py:1702-1708, which labels it with the next step's number)."""
        actor = self.roles.get("actor")
        if isinstance(self.tool, TorchMemoryTool) and actor is not None:
            self.tool.dump(self.tool.snapshot_path(actor.save_path, f"step{step}", f"post_update_step{step}"))


OFF = WorkerProfiler(None, 0, {}, "")


def worker_profiler(
    cfg, rank: int, roles: dict[str, str], folder: str, device: torch.device, rollout: RolloutRecorder | None = None
) -> WorkerProfiler:
    """`roles`: each role whose phases run in this process -> the role whose settings record them. `rollout`: the
    rollout profiler where it records this worker's engine."""
    name = cfg.global_profiler.tool
    if name is None or not roles:
        return OFF
    profiles = {held: role_profile(cfg, by) for held, by in roles.items()}
    return WorkerProfiler(TOOLS[name](rank, device, next(iter(profiles.values()))), rank, profiles, folder, rollout)


# --- the driver's side ---


@dataclass(frozen=True)
class StepWindows:
    """Which steps the workers record, in windows (verl ray_trainer.py:1350-1370, 1657-1669): each step of
    global_profiler.steps alone, or with profile_continuous_steps each run of consecutive steps as one. The driver
    calls start_profile before each recorded step (the first of a window begins the recording; a resumed run's
    first step begins one, as verl's) and stop_profile after the last of a window."""

    steps: frozenset[int]
    continuous: bool

    @classmethod
    def of(cls, cfg) -> StepWindows:
        g = cfg.global_profiler
        return cls(frozenset(g.steps or ()) if g.tool else frozenset(), g.profile_continuous_steps)

    def starts(self, step: int) -> bool:
        return step in self.steps

    def stops(self, step: int) -> bool:
        return step in self.steps and not (self.continuous and step + 1 in self.steps)

    def left_open(self, last: int) -> bool:
        """Whether the run's last step leaves a window open (training ended inside it): the driver stops it then,
        where verl would write nothing."""
        return self.starts(last) and not self.stops(last)


def snapshots_after_update(cfg) -> bool:
    return cfg.global_profiler.tool == "torch_memory"


def nsight_runtime_env(cfg) -> dict:
    """The workers' Ray options for tool=nsys with steps to record (verl single_controller/ray/base.py:442-446,
    629-638): runtime_env "nsight", Ray's nsys wrapper, with the worker options as `nsys profile` flags; a
    capture-range-end of null is repeat-shutdown:<6 x the steps>, as verl sets it. {} otherwise."""
    g = cfg.global_profiler
    if g.tool != "nsys" or not g.steps:
        return {}
    options = {}
    for key, value in g.global_tool_config.nsys.worker_nsight_options.items():
        if key == "capture-range-end" and value is None:
            value = f"repeat-shutdown:{6 * len(g.steps)}"
        if value is not None:  # a flag given no value is left out rather than passed as "None"
            options[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return {"runtime_env": {"nsight": options}}
