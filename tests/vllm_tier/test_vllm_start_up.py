"""Where vLLM is installed, rollout.name=auto's choice (in the driver, which never generates) and the start-up
checks read vLLM's release from its metadata and leave vLLM unimported; the engine's constructor imports it and asks
its model runners."""

import subprocess
import sys

import pytest

PROBE = """
import sys
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.rollout.engines import ENGINES, engine_class
from rlrig.trainer.workers.start_checks import start_refusal

cfg = parse_overrides([f"actor_rollout_ref.rollout.name={sys.argv[2]}"])
engine = engine_class(cfg.actor_rollout_ref.rollout.name)
assert engine is ENGINES["vllm"]
assert start_refusal(cfg, sys.argv[1], "cpu", engine) is None
print(sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm.")))
"""


@pytest.mark.parametrize("name", ["auto", "vllm"])
def test_the_start_up_checks_pass_vllm_without_importing_it(name):
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    r = subprocess.run(
        [sys.executable, "-c", PROBE, ensure_tiny_model(), name], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-3000:]


def test_the_release_read_is_the_one_vllm_reports():
    import vllm

    from rlrig.trainer.rollout.engines import installed_release

    assert installed_release("vllm") == vllm.__version__
    probe = subprocess.run(
        [sys.executable, "-c", "from rlrig.trainer.rollout.engines import installed_release as r; print(r('vllm'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == vllm.__version__, probe.stderr[-2000:]
