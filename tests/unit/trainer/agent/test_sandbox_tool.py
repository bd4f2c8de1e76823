"""verl's SandboxFusionTool, named by its verl path in a tool config, running code in `rlrig sandbox`."""

from __future__ import annotations

import asyncio
import shutil
import threading

import pytest
import yaml

from rlrig.trainer.agent.tools import load_tools
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.reward.sandbox.cli import start


@pytest.fixture(scope="module")
def url():
    server = start("127.0.0.1", 0, max_concurrency=2, memory_limit_mb=512, timeout=5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.url
    server.shutdown()
    server.server_close()
    shutil.rmtree(server.work_dir, ignore_errors=True)


def tool_config(tmp_path, config: dict):
    path = tmp_path / "tools.yaml"
    entry = {"class_name": "verl.tools.sandbox_fusion_tools.SandboxFusionTool", "config": {"type": "native", **config}}
    path.write_text(yaml.safe_dump({"tools": [entry]}))
    return str(path)


def call(tool, parameters: dict) -> str:
    async def go():
        instance, _ = await tool.create()
        response, reward, _ = await tool.execute(instance, parameters)
        await tool.release(instance)
        assert reward is None
        return response.text

    return asyncio.run(go())


def test_the_model_reads_stdout_and_stderr(tmp_path, url):
    tool = load_tools(tool_config(tmp_path, {"sandbox_fusion_url": url, "default_timeout": 5}))["code_interpreter"]
    assert call(tool, {"code": "import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)"}) == "42\nwarn\n"
    assert call(tool, {"code": "echo hi", "language": "bash"}) == "hi\n"
    assert call(tool, {"code": "while True: pass", "timeout": 1}) == "no stdout here"  # a time limit: no output to read


def test_the_url_is_required(tmp_path):
    with pytest.raises(ConfigError, match="config.sandbox_fusion_url='' must be a SandboxFusion /run_code URL"):
        load_tools(tool_config(tmp_path, {}))
