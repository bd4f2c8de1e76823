"""Token ids for the messages the loop adds between the model's turns (tool responses, a user's reply), as verl's
agent loop makes them: the new messages alone through the chat template with the generation prompt, minus the
template's own default system block (a template that opens every conversation with one would repeat it). The model's
turns are never re-tokenized: its context is the engine's own tokens plus these deltas."""

from __future__ import annotations


def template_ids(tokenizer, messages: list[dict], template_kwargs: dict, tools=None, generation_prompt=True) -> list:
    text = tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=False, **template_kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def default_system_prefix(tokenizer) -> list[int]:
    """The tokens a template puts before any message of its own accord (Qwen2.5: its default system prompt): one user
    turn's ids minus what a second user turn adds to them (verl's initialize_system_prompt)."""
    one = template_ids(tokenizer, [{"role": "user", "content": ""}], {}, generation_prompt=False)
    two = template_ids(tokenizer, [{"role": "user", "content": ""}] * 2, {}, generation_prompt=False)
    return one[: len(one) - (len(two) - len(one))]


class Deltas:
    def __init__(self, tokenizer, template_kwargs: dict):
        self.tok, self.kwargs = tokenizer, dict(template_kwargs)
        self.prefix = len(default_system_prefix(tokenizer))

    def __call__(self, messages: list[dict]) -> list[int]:
        """The ids that follow the model's last token for `messages`, ending in the template's generation prompt."""
        return template_ids(self.tok, messages, self.kwargs)[self.prefix :]
