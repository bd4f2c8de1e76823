"""What a run imports before its workers exist: `rlrig train`'s config check (before any cluster) and the start-up
probe (workers/start_checks.py, a fresh process on every node) import the config's modules and torch, not
transformers' model and generation code, seconds of every run's start-up that those processes never use."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# transformers' model and generation code, and what loads with it; `transformers` itself (its lazy top level, for
# AutoConfig) is allowed
HEAVY = ("transformers.modeling_utils", "transformers.generation.utils", "peft", "accelerate")

CONFIG_CHECK = """
from rlrig.entrypoint import cli
from rlrig.trainer.config.config_files import assemble
from rlrig.trainer.config.overrides import parse_overrides

parse_overrides(assemble(None, None, None, []))
"""

# the probe on the embedded default's config with the hf engine (auto would import vLLM where it is installed)
START_PROBE = """
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.workers.start_checks import start_refusal

cfg = parse_overrides(["actor_rollout_ref.rollout.name=hf"])
assert start_refusal(cfg.to_dict(), "/no/model/read/by/the/default/checks", "cpu") is None
"""


@pytest.mark.parametrize("code", [CONFIG_CHECK, START_PROBE], ids=["config-check", "start-probe"])
def test_leaves_transformers_model_code_unimported(code):
    report = f"\nimport sys\nprint(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", code + report], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
