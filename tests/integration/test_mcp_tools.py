"""The embedded tool task with its calculator served by an MCP server (rlrig train --preset tools-mcp, the hf engine):
each rollout worker starts the server over stdio, the model's calls reach it, the reward rises as with the built-in
calculator, and no server outlives the run; a server that dies mid-run ends it in one line."""

import json
import re
import sys
import time

import psutil
import pytest

from tests.integration.test_multi_turn import STEPS, check_it_learned
from tests.integration.test_train import metrics, rlrig

# one after another (pytest-xdist's loadgroup): a test counts the calculator servers running on the machine
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("mcp-calculator")]


CALCULATOR = "rlrig.trainer.agent.tools.calculator_server"


def servers_running(name: str = CALCULATOR) -> set[int]:
    """The servers running on this machine whose command line names `name`."""
    found = set()
    for p in psutil.process_iter(["pid", "cmdline"]):
        if name in " ".join(p.info["cmdline"] or []):
            found.add(p.info["pid"])
    return found


def no_new_servers(before: set[int], name: str = CALCULATOR) -> bool:
    """No server that was not running before is still running, once its worker's exit has reached it."""
    deadline = time.monotonic() + 20
    while servers_running(name) - before and time.monotonic() < deadline:
        time.sleep(0.5)
    return servers_running(name) - before == set()


def learns_with(engine: str, run) -> dict:
    """--preset tools-mcp for STEPS steps on `engine`: the score and validation rise, no server is left behind."""
    before = servers_running()
    r = rlrig(
        "train",
        "--preset",
        "tools-mcp",
        f"actor_rollout_ref.rollout.name={engine}",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={STEPS}",
        f"trainer.save_freq={STEPS}",
        f"trainer.default_local_dir={run}",
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rows = metrics(run)
    print(check_it_learned(rows))
    assert no_new_servers(before)
    return rows


# long: 30 steps of learning (about a minute and a half on two cores)
@pytest.mark.long
def test_the_tool_task_learns_to_use_the_mcp_calculator(tmp_path):
    learns_with("hf", tmp_path / "run")


DYING = """
import os
from mcp.server.mcpserver import MCPServer
from rlrig.trainer.agent.tools.calculator import evaluate, shown

server = MCPServer("dying", log_level="WARNING")
calls = []


@server.tool()
def calculator(expression: str) -> str:
    \"\"\"Evaluates an arithmetic expression, 20 times\"\"\"
    calls.append(expression)
    if len(calls) > 20:
        os._exit(1)
    return shown(evaluate(expression))


server.run("stdio")
"""


def test_a_server_that_dies_mid_run_ends_it_in_one_line_naming_it(tmp_path):
    """Raised in a rollout worker, the error reaches the driver's one line; no server is left."""
    (tmp_path / "dying.py").write_text(DYING)
    servers = {"mcpServers": {"dying": {"command": sys.executable, "args": [str(tmp_path / "dying.py")]}}}
    (tmp_path / "servers.json").write_text(json.dumps(servers))
    tools = tmp_path / "tools.yaml"
    tools.write_text(
        "tools:\n  - class_name: verl.tools.mcp_base_tool.MCPBaseTool\n    config: {type: mcp}\n"
        f"    mcp: {{mcp_servers_config_path: {tmp_path / 'servers.json'}}}\n"
    )
    before = servers_running("dying.py")
    r = rlrig(
        "train",
        "--preset",
        "tools",
        "actor_rollout_ref.rollout.name=hf",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
        "trainer.total_training_steps=3",
        "trainer.val_before_train=False",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        timeout=600,
    )
    assert r.returncode == 2, r.stderr[-3000:]
    line = next(x for x in r.stderr.splitlines() if x.startswith("rlrig: error:"))
    assert re.fullmatch(r"rlrig: error: .*tools\[0\]: MCP server dying \(command: .*\) is gone mid-run .*", line)
    assert no_new_servers(before, "dying.py")
