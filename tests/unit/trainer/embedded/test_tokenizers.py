"""The embedded models' tokenizers as a run loads them (AutoTokenizer on the model's folder, which transformers maps to
Qwen2's tokenizer class for a Qwen2 model) encode and decode as the ones they were built and trained with: spaces and
the tool task's pieces included."""

import pytest
from transformers import AutoTokenizer

from rlrig.trainer.embedded.tiny_model import build_tokenizer, ensure_tiny_model
from rlrig.trainer.embedded.tool_model import CALL_CLOSE, CALL_OPEN, build_tool_tokenizer, ensure_tool_model

pytestmark = pytest.mark.process

TEXTS = [
    "12+7=#### 19<eos>",
    "-3 * 4 = -12, 1.5<eos>",
    f"<tools>12*3=<tool_call>{CALL_OPEN}12*3{CALL_CLOSE}</tool_call><eos>",
]


@pytest.mark.parametrize(
    "ensure, build", [(ensure_tiny_model, build_tokenizer), (ensure_tool_model, build_tool_tokenizer)]
)
def test_the_saved_tokenizer_reloads_as_it_was_built(ensure, build):
    built, loaded = build(), AutoTokenizer.from_pretrained(ensure())
    for text in TEXTS if build is build_tool_tokenizer else TEXTS[:2]:
        ids = built(text, add_special_tokens=False)["input_ids"]
        assert loaded(text, add_special_tokens=False)["input_ids"] == ids
        assert loaded.decode(ids) == built.decode(ids)
    assert built.decode(built(" ", add_special_tokens=False)["input_ids"]) == " "  # a space is a token, never dropped
