"""What building and syncing an engine leaves in the training process: TF32 as the trainer set it, and vLLM's
prefix cache dropped after every sync or an error; the model runner checks cover Model Runner V2. vLLM's shapes as
read in its 0.16 and 0.32 wheels: LLM.reset_prefix_cache(reset_running_requests=False, reset_connector=False) -> bool,
False while a request holds KV blocks (v1/core/block_pool.py); the GPU worker's constructor calls
torch.set_float32_matmul_precision(VLLM_FLOAT32_MATMUL_PRECISION), "highest" by default (v1/worker/gpu_worker.py);
Model Runner V2's GPUModelRunner in vllm.v1.worker.gpu.model_runner, reload_weights(weights_iterator=None,
weights_path=None, is_checkpoint_format=True) in 0.32."""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.model import precision
from rlrig.trainer.rollout import engines
from rlrig.trainer.rollout.engines import vllm_engine
from tests.unit.trainer.rollout.test_rollout import _fake_vllm, _RecordingLLM, _Runner012, _Runner016


class _LikeVLLM(engines.RolloutEngine):
    """An engine whose constructor sets the matmul precision as vLLM's GPU worker does in the training process."""

    name = "like-vllm"

    def __init__(self, ctx):
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False


@pytest.fixture
def tf32_restored():
    matmul, cudnn = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    yield
    torch.set_float32_matmul_precision(matmul)
    torch.backends.cudnn.allow_tf32 = cudnn


@pytest.mark.parametrize("trainer_allows", [True, False])
def test_tf32_is_as_the_trainer_set_it_after_an_engine_is_built(tf32_restored, trainer_allows):
    if trainer_allows:
        precision.allow_tf32()  # what workers/base.py start_rank does on a GPU
    else:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    ctx = engines.EngineContext(None, None, RolloutConfig(), 8, 4, "/m", "cpu", 0)
    engines.make_engine(_LikeVLLM, ctx)
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before == (trainer_allows,) * 2


class _BusyLLM(_RecordingLLM):
    def reset_prefix_cache(self, reset_running_requests=False, reset_connector=False):
        return False


def test_a_prefix_cache_vllm_kept_after_a_sync_is_an_error(monkeypatch):
    _fake_vllm(monkeypatch, _Runner016)
    sys.modules["vllm"].LLM = _BusyLLM
    monkeypatch.setattr(vllm_engine, "gpu_index", lambda: 0)
    monkeypatch.setattr(vllm_engine.dist, "get_rank", lambda *a: 0)
    monkeypatch.setattr(vllm_engine.dist, "get_world_size", lambda *a: 1)
    monkeypatch.setattr(vllm_engine.os, "environ", {})
    tok = SimpleNamespace(eos_token_id=9, pad_token_id=0)
    eng = vllm_engine.VLLMRollout(engines.EngineContext(None, tok, RolloutConfig(name="vllm"), 8, 4, "/m", "cuda", 0))
    with pytest.raises(RuntimeError, match="could not drop its prefix cache after a weight sync"):
        eng.sync_weights([("w", torch.zeros(2))])


@pytest.mark.parametrize(
    "v2, device, takes",
    [
        (_Runner016, "cuda", True),
        (_Runner012, "cuda", False),  # V2 runs on CUDA: its reload_weights must take the iterator too
        (_Runner012, "cpu", True),  # not consulted on CPU, where vLLM runs V1's
        (None, "cuda", True),  # a vLLM without Model Runner V2
    ],
)
def test_the_weights_check_covers_model_runner_v2_on_cuda(monkeypatch, v2, device, takes):
    _fake_vllm(monkeypatch, _Runner016)
    if v2 is not None:
        gpu = types.ModuleType("vllm.v1.worker.gpu")
        runner = types.ModuleType(vllm_engine.RUNNER_V2)
        runner.GPUModelRunner = v2
        monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu", gpu)
        monkeypatch.setitem(sys.modules, vllm_engine.RUNNER_V2, runner)
    assert vllm_engine.takes_weights_in_memory(device) is takes
