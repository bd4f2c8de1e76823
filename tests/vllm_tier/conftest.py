import pytest

try:
    import vllm  # noqa: F401  (the repo root is on the path, not tests/: this folder cannot shadow vllm)
except ImportError as e:  # the main .venv has no vLLM; tests/run.sh runs this tier in .venv-vllm
    collect_ignore_glob = ["test_*.py"]
    print(f"tests/vllm_tier: vLLM not importable here ({e}); tests/run.sh runs this tier in .venv-vllm")


@pytest.fixture(scope="session")
def tiny():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    path = ensure_tiny_model()
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return path, tok, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
