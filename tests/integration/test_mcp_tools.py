"""The embedded tool task with its calculator served by an MCP server (rlrig train --preset tools-mcp, the hf engine):
each rollout worker starts the server over stdio, the model's calls reach it, the reward rises as with the built-in
calculator, and no server outlives the run."""

import time

import psutil
import pytest

from tests.integration.test_multi_turn import STEPS, check_it_learned
from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration


def servers() -> set[int]:
    """The calculator servers running on this machine."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if "rlrig.trainer.agent.tools.calculator_server" in " ".join(p.info["cmdline"] or []):
            found.add(p.info["pid"])
    return found


# long: 30 steps of learning (about a minute and a half on two cores)
@pytest.mark.long
def test_the_tool_task_learns_to_use_the_mcp_calculator(tmp_path):
    before = servers()
    run = tmp_path / "run"
    r = rlrig(
        "train",
        "--preset",
        "tools-mcp",
        "actor_rollout_ref.rollout.name=hf",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        f"trainer.save_freq={STEPS}",
        f"trainer.default_local_dir={run}",
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    print(check_it_learned(metrics(run)))
    deadline = time.monotonic() + 20  # a worker's server ends with its worker: it reads the end of its input
    while servers() - before and time.monotonic() < deadline:
        time.sleep(0.5)
    assert servers() - before == set()
