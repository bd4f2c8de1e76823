"""What a run imports before its workers exist: `rlrig train`'s config check (before any cluster) and the start-up
probe (workers/start_checks.py, a fresh process on every node) import the config's modules and torch, not
transformers' model and generation code, seconds of every run's start-up that those processes never use."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.process

# transformers' model and generation code, and what loads with it; `transformers` itself (its lazy top level, for
# AutoConfig) is allowed, and for the checkpoint layout its weight conversion, which loads accelerate
HEAVY = ("transformers.modeling_utils", "transformers.generation.utils", "peft", "accelerate")
MODEL_CODE = HEAVY[:-1]

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

# what the probe asks of a model for an engine that loads checkpoints (vLLM, SGLang): its config's layout
LAYOUT_CHECK = """
import sys
from rlrig.trainer.config.schema import ModelConfig
from rlrig.trainer.rollout.engines import ENGINES
from rlrig.trainer.workers.start_checks import layout_refusal

assert layout_refusal(ModelConfig(), sys.argv[1], ENGINES["vllm"]) is None
"""


@pytest.mark.parametrize(
    ("code", "unimported"),
    [(CONFIG_CHECK, HEAVY), (START_PROBE, HEAVY), (LAYOUT_CHECK, MODEL_CODE)],
    ids=["config-check", "start-probe", "checkpoint-layout"],
)
def test_leaves_transformers_model_code_unimported(code, unimported):
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    report = f"\nimport sys\nprint(sorted(m for m in {unimported!r} if m in sys.modules))"
    model = ensure_tiny_model()  # built here, where building it imports the model code
    cmd = [sys.executable, "-c", code + report, model]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
