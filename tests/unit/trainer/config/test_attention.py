"""model.override_config.attn_implementation: passed to from_pretrained as verl passes it (set on the config, as other
override_config keys are, transformers never read it), and checked at start-up."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError
from tests.helpers.gpu_config import GPU_MICRO

KEY = "actor_rollout_ref.model.override_config.attn_implementation"
GPU = ["trainer.device=cuda", *GPU_MICRO]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_the_model_loads_with_the_implementation_named(impl):
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model.loading import model_kwargs

    cfg = parse_overrides([f"{KEY}={impl}"])
    path = ensure_tiny_model()
    model = AutoModelForCausalLM.from_pretrained(path, **model_kwargs(cfg.actor_rollout_ref.model, path))
    assert model.config._attn_implementation == impl


@pytest.mark.parametrize(
    "extra, refusal",
    [
        ([f"{KEY}=flashy"], "flashy: not an attention implementation transformers knows; use one of eager, sdpa"),
        ([f"{KEY}=flash_attention_2", "trainer.device=cpu"], "flash attention runs on GPUs only; use sdpa"),
        ([f"{KEY}=flash_attention_2", *GPU], "the flash_attn package is not installed here (pip install flash-attn)"),
        ([f"{KEY}=flash_attention_4", *GPU], "the flash_attn.cute package is not installed here"),
        ([f"{KEY}=flex_attention"], None),
        ([f"+{KEY}=paged|eager"], None),
    ],
)
def test_an_implementation_that_cannot_run_here_is_one_line_at_start_up(extra, refusal):
    if refusal is None:
        parse_overrides(extra)
        return
    with pytest.raises(ConfigError) as e:
        parse_overrides(extra)
    assert refusal in str(e.value) and "\n" not in str(e.value)
