"""What a run imports before its cluster exists: `rlrig train`'s config check imports the config's modules and torch,
not transformers' model and generation code, seconds of every run's start-up that the process never uses."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# transformers' model and generation code, and what loads with it; `transformers` itself (its lazy top level, for
# AutoConfig) is allowed
HEAVY = ("transformers.modeling_utils", "transformers.generation.utils", "peft", "accelerate")

CONFIG_CHECK = f"""
import sys
from rlrig.entrypoint import cli
from rlrig.trainer.config.config_files import assemble
from rlrig.trainer.config.overrides import parse_overrides

parse_overrides(assemble(None, None, None, []))
print(sorted(m for m in {HEAVY!r} if m in sys.modules))
"""


def test_the_config_check_leaves_transformers_model_code_unimported():
    r = subprocess.run([sys.executable, "-c", CONFIG_CHECK], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
