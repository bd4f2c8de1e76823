"""verl 0.9's torch profiler schedule (profiler.tool_config.torch.schedule.*) over the update's mini batches: which
of a profiled step's ranges each trace file holds, as verl's torch profiler keeps them."""

import gzip
import json

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.profiler_settings import RoleProfile, role_profile
from rlrig.trainer.workers import profiling

RANGES = ("gen", "mb0", "mb1", "mb2", "mb3")


def _step(tool: profiling.TorchTool, profile: RoleProfile, folder: str) -> None:
    """A recorded step: a phase before the update, then four mini batches, each ending as the update's do."""
    tool.begin(profile, folder, "step1")
    with torch.profiler.record_function("gen"):
        torch.ones(4).add_(1)
    for i in range(4):
        with torch.profiler.record_function(f"mb{i}"):
            torch.ones(4).mul_(i)
        profiling.mini_batch_done()
    tool.end()


def _held(path) -> set[str]:
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    return {e.get("name") for e in events} & set(RANGES)


@pytest.mark.parametrize(
    "schedule,discrete,folder,files",
    [
        # active=0 (verl's default): no schedule, the whole step
        (None, False, "e2e", {"": set(RANGES)}),
        # a window spanning the step: the phases before the update and the first `active` mini batches (repeat 1)
        ((0, 0, 0, 2, 0), False, "e2e", {"": {"gen", "mb0", "mb1"}}),
        # skipping ahead drops what ran before the window, as verl documents
        ((1, 0, 0, 1, 0), False, "e2e", {"": {"mb1"}}),
        ((0, 1, 0, 1, 2), False, "e2e", {"": {"mb1"}, "_part1": {"mb3"}}),
        # discrete: the update's own trace is scheduled, repeating until it ends (repeat 0)
        ((0, 1, 0, 1, 0), True, "actor_update", {"": {"mb1"}, "_part1": {"mb3"}}),
        # ... and another phase's is whole
        ((0, 1, 0, 1, 0), True, "rollout_generate", {"": set(RANGES)}),
    ],
)
def test_the_schedule_keeps_the_mini_batches_verl_keeps(tmp_path, schedule, discrete, folder, files):
    profile = RoleProfile(True, False, (), str(tmp_path), discrete, (), 0, 0, schedule)
    _step(profiling.TorchTool(0, torch.device("cpu"), profile), profile, folder)
    written = {p.name: p for p in (tmp_path / folder).iterdir()}
    assert sorted(written) == sorted(f"step1_prof_rank-0{s}.json.gz" for s in files)
    assert {s: _held(written[f"step1_prof_rank-0{s}.json.gz"]) for s in files} == files
    assert not profiling._SCHEDULED  # the update's steps reach no profiler once the recording ended


def test_the_schedule_keys_reach_the_role_profile():
    key = "actor_rollout_ref.actor.profiler.tool_config.torch.schedule"
    cfg = parse_overrides(["actor_rollout_ref.model.path=/m", f"{key}.active=2", f"{key}.skip_first=1"])
    assert role_profile(cfg, "actor").schedule == (1, 0, 0, 2, 0)
    assert role_profile(cfg, "critic").schedule is None  # active=0: no schedule
    with pytest.raises(Exception) as e:
        parse_overrides(["actor_rollout_ref.model.path=/m", f"{key}.wait=-1"])
    assert f"{key}.wait" in str(e.value)
