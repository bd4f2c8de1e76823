"""SGLang's weight-sync calls, its supported releases and where it puts a one-GPU engine. SGLang needs CUDA, so its
Engine is a stand-in built from the API shapes read in the released wheels (0.5.15 through 0.5.23):

- update_weights_from_tensor(named_tensors, load_format=None, flush_cache=True) -> (success, message), every release;
  from 0.5.21 (success=False, "update_weights_from_tensor must run between begin_weight_update() and
  end_weight_update()") outside a session (managers/scheduler_components/weight_updater.py);
- begin_weight_update(selector="all") and end_weight_update() -> (success, message), from 0.5.21 (entrypoints/
  engine.py); a second begin while a session is open answers success=False;
- flush_cache() -> FlushCacheReqOutput(success, message), every release;
- LocalSerializedTensor in model_executor/model_runner_components/weight_updater.py from 0.5.16, in
  model_executor/model_runner.py before; sglang.__version__ from sglang/version.py.
"""

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from rlrig.trainer import devices
from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.rollout import engines
from rlrig.trainer.rollout import tp_groups as T
from rlrig.trainer.rollout.engines import base
from rlrig.trainer.rollout.engines import sglang_engine as S

SESSION_REFUSAL = "update_weights_from_tensor must run between begin_weight_update() and end_weight_update()"


class Engine0520:
    """sglang.Engine's weight calls in 0.5.16-0.5.20: no session."""

    def __init__(self, **kw):
        self.kw, self.calls, self.loaded = kw, [], {}

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        self.calls.append("update")
        self.loaded.update((name, t.clone()) for name, t in named_tensors)
        return True, "Success"

    def flush_cache(self):
        self.calls.append("flush")
        return SimpleNamespace(success=True, message="")

    def release_memory_occupation(self, tags=None):
        self.calls.append("release")

    def resume_memory_occupation(self, tags=None):
        self.calls.append("resume")


class Engine0523(Engine0520):
    """0.5.21-0.5.23: weights only inside a begin/end session."""

    session = False

    def begin_weight_update(self, selector="all"):
        self.calls.append("begin")
        if self.session:
            return False, "a weight-update session is already open; call end_weight_update() first"
        self.session = True
        return True, "Success"

    def end_weight_update(self):
        self.calls.append("end")
        if not self.session:
            return False, "no weight-update session is open; call begin_weight_update() first"
        self.session = False
        return True, "Success"

    def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
        if not self.session:
            self.calls.append("update")
            return False, SESSION_REFUSAL
        return super().update_weights_from_tensor(named_tensors, load_format, flush_cache)


def fake_sglang(monkeypatch, engine_cls, version="0.5.23"):
    mod = types.ModuleType("sglang")
    mod.__version__, mod.Engine = version, engine_cls
    monkeypatch.setitem(sys.modules, "sglang", mod)
    monkeypatch.setattr(S, "gpu_index", lambda: 0, raising=False)


def sglang_engine(monkeypatch, engine_cls, version="0.5.23", **cfg):
    fake_sglang(monkeypatch, engine_cls, version)
    cfg = RolloutConfig(name="sglang", **cfg)
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    return engines.make_engine(S.SGLangRollout, engines.EngineContext(None, tok, cfg, 8, 4, "/m", "cuda", 0))


WEIGHTS = [("a", torch.ones(2)), ("b", torch.full((3,), 2.0))]


@pytest.mark.parametrize("engine_cls", [Engine0520, Engine0523])
def test_every_release_takes_the_weights(monkeypatch, engine_cls):
    eng = sglang_engine(monkeypatch, engine_cls)
    eng.sync_weights(iter(WEIGHTS))
    one = ["begin", "update", "end", "flush"] if engine_cls is Engine0523 else ["update", "flush"]
    assert eng.engine.calls == one
    assert {k: v.tolist() for k, v in eng.engine.loaded.items()} == {"a": [1.0, 1.0], "b": [2.0, 2.0, 2.0]}
    eng.sync_weights(iter(WEIGHTS))  # the session was closed: the next sync opens its own
    assert eng.engine.calls == one + one


def test_a_refused_update_is_raised_naming_the_engine_the_bucket_and_sglangs_words(monkeypatch):
    class Refusing(Engine0523):
        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            self.calls.append("update")
            return False, "Parameter b not found"

    eng = sglang_engine(monkeypatch, Refusing)
    taken = []
    weights = ((name, taken.append(name) or t) for name, t in WEIGHTS)
    with pytest.raises(RuntimeError) as e:
        eng.sync_weights(weights)
    assert str(e.value) == (
        "the weight sync into the engine (sglang) failed: update_weights_from_tensor of bucket 0 (2 tensors, a .. b): "
        "SGLang said 'Parameter b not found'"
    )
    # the session closed all the same, no cache flushed for weights that never arrived, every tensor taken
    assert eng.engine.calls == ["begin", "update", "end"] and taken == ["a", "b"]


def test_an_update_outside_a_session_is_not_taken_for_done(monkeypatch):
    """0.5.21's refusal as an engine met it before the session was opened: raised, never a silent no-op."""

    class OutsideSession(Engine0520):
        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            return False, SESSION_REFUSAL

    eng = sglang_engine(monkeypatch, OutsideSession)
    with pytest.raises(RuntimeError, match=r"SGLang said 'update_weights_from_tensor must run between"):
        eng.sync_weights(iter(WEIGHTS))


@pytest.mark.parametrize(
    "failing, calls",
    [
        ("begin_weight_update", ["begin"]),  # nothing loaded, no session to close
        ("end_weight_update", ["begin", "update", "end"]),
        ("flush_cache", ["begin", "update", "end", "flush"]),
    ],
)
def test_the_session_and_the_flush_are_checked_too(monkeypatch, failing, calls):
    class Failing(Engine0523):
        pass

    def refuse(self, *a, **kw):
        self.calls.append({"begin_weight_update": "begin", "end_weight_update": "end", "flush_cache": "flush"}[failing])
        answer = (False, "no")
        return SimpleNamespace(success=False, message="no") if failing == "flush_cache" else answer

    setattr(Failing, failing, refuse)
    eng = sglang_engine(monkeypatch, Failing)
    with pytest.raises(RuntimeError, match=rf"failed: {failing}\(\): SGLang said 'no'$"):
        eng.sync_weights(iter(WEIGHTS))
    assert eng.engine.calls == calls


@pytest.mark.parametrize(
    "version, ok",
    [("0.5.2", False), ("0.5.15", False), ("0.5.15.post1", False), ("0.5.16", True), ("0.5.20", True)]
    + [("0.5.21", True), ("0.5.23", True), ("0.5.24", False), ("0.6.0", False)],
)
def test_the_supported_releases_are_checked_at_start_up_in_one_line(monkeypatch, version, ok):
    """0.5.15 and older keep LocalSerializedTensor elsewhere (the first tensor-parallel sync raised ImportError,
    after the engine started); 0.5.24 and newer are unread."""
    if ok:
        assert isinstance(sglang_engine(monkeypatch, Engine0523, version).engine, Engine0523)
        return
    with pytest.raises(engines.EngineUnavailable) as e:
        sglang_engine(monkeypatch, Engine0523, version)
    assert str(e.value) == (
        f"SGLang {version} is not a release rlrig supports (SGLang >=0.5.16,<0.5.24); "
        "pip install 'rlrig[sglang]' on a CUDA machine"
    )
    assert not isinstance(e.value, engines.EngineNotInstalled)


def test_pyproject_pins_the_supported_releases():
    import pathlib
    import re

    pyproject = (pathlib.Path(__file__).resolve().parents[4] / "pyproject.toml").read_text()
    assert re.findall(r'^sglang = \["sglang([^"]*)"\]', pyproject, re.M) == [S.SUPPORTED]
    assert S.SGLangRollout.supported == S.SUPPORTED and base.RolloutEngine.supported is None


def test_a_one_gpu_engine_starts_on_the_workers_own_gpu_under_a_noset_flag(monkeypatch):
    """Under RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES the worker sees all of its node's GPUs and holds the one
    Ray assigned it (here 3): SGLang is told so (base_gpu_id), never left on GPU 0."""
    fake_sglang(monkeypatch, Engine0523)
    monkeypatch.setattr(S, "gpu_index", devices.gpu_index)
    monkeypatch.setenv("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "1")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_assigned_gpu", lambda env, assigned: "3")
    tok = SimpleNamespace(eos_token_id=2, pad_token_id=0)
    ctx = engines.EngineContext(None, tok, RolloutConfig(name="sglang"), 8, 4, "/m", "cuda", 0)
    assert engines.make_engine(S.SGLangRollout, ctx).engine.kw["base_gpu_id"] == 3
    # the user's word is still last
    ctx.cfg = RolloutConfig(name="sglang", engine_kwargs={"sglang": {"base_gpu_id": 5}})
    assert engines.make_engine(S.SGLangRollout, ctx).engine.kw["base_gpu_id"] == 5


@pytest.mark.parametrize(
    "env, assigned, gpu",
    [
        ({"CUDA_VISIBLE_DEVICES": "6"}, None, "6"),  # Ray's default: the one GPU it left visible
        ({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}, ["5"], "5"),  # the variable unset: Ray's assignment
        ({"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "4,5,6"}, ["6"], "6"),
        ({}, None, ""),  # nothing names one GPU
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, None, ""),
    ],
)
def test_node_gpu_id(env, assigned, gpu):
    assert devices.node_gpu_id(env, assigned) == gpu


def test_a_spanning_engine_never_hides_every_gpu():
    """Before, a member under a NOSET flag with CUDA_VISIBLE_DEVICES unset sent "": the engine got devices=""."""
    with pytest.raises(ValueError, match=r"workers \[0, 1\] of an engine over 2 workers name no GPU of their own"):
        T.node_layout([("a", ""), ("a", "")], 0)
    assert T.node_layout([("a", ""), ("a", "")], 0, on_gpus=False).devices == ""  # CPU: no GPUs to name
