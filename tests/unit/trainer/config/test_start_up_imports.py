"""What a run imports where it does not use it: `rlrig train`'s config check imports the config's modules and torch,
not transformers' model and generation code; the driver imports the workers' classes, not the model stack that
the workers import when they build (torch.distributed's DTensor and checkpoint modules, transformers' model and
generation code): seconds of every run's start-up, on the way to the workers."""

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


# the driver as it starts the workers (driver/launch.py), after it has loaded the tokenizer
WORKER_CLASSES = f"""
import sys
from transformers import AutoTokenizer
from rlrig.trainer.workers.critic_worker import CriticWorker
from rlrig.trainer.workers.rollout_worker import RolloutWorker
from rlrig.trainer.workers.training_worker import TrainingWorker

heavy = {HEAVY!r} + ("torch.distributed.tensor", "torch.distributed.checkpoint", "torch.distributed.fsdp")
print(sorted(m for m in heavy if m in sys.modules))
"""


@pytest.mark.parametrize("script", [CONFIG_CHECK, WORKER_CLASSES], ids=["config-check", "driver's-worker-classes"])
def test_a_process_leaves_the_model_stack_it_does_not_use_unimported(script):
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout
