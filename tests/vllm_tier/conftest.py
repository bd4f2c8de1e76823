import pytest

try:
    import vllm  # noqa: F401  (this folder must not be named vllm: tests/ is on sys.path)
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
