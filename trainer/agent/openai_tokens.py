"""An OpenAI-client agent's sample as one token sequence, made of the exact ids of its calls (agent/openai_agent.py).

Each call to the endpoint is a prompt the engine read and a completion it wrote. The first call's prompt is the
sample's prompt. A later call's prompt is matched against what the sample holds so far (its prompt + response):

    common = the longest common prefix of (prompt + response) and the call's prompt
    response = response[:common - len(prompt)] + call_prompt[common:] (mask 0) + completion (mask 1)

so the model's own tokens are never re-tokenized: where the agent's follow-up carries them as they came, they stay
trained on; what the agent added (tool results, a user's turn, and whatever the chat template re-rendered
differently from what the model wrote) follows them masked, and the sequence is exactly what the engine read before
its last completion. A call whose prompt does not begin with the sample's prompt (the agent rewrote the question)
starts the sample over from that call.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class SampleTokens:
    """A sample's tokens so far: its prompt, its response, the response's mask (1: the model's) and log-probs (0 where
    masked or where the engine reported none)."""

    prompt: list[int] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    calls: int = 0
    restarts: int = 0  # calls that started the sample over
    with_logps: bool = True  # every completion came with the engine's log-probs

    def continues(self, prompt_ids: list[int]) -> bool:
        """Whether a call with this prompt extends the sample (else it starts it over)."""
        return self.calls > 0 and prompt_ids[: len(self.prompt)] == self.prompt

    def _split(self, prompt_ids: list[int]) -> tuple[int, list[int]]:
        """(how many response tokens the call keeps, the call's prompt tokens that follow them: the masked ones)."""
        common = max(common_prefix(self.prompt + self.ids, prompt_ids), len(self.prompt))
        return common - len(self.prompt), list(prompt_ids[common:])

    def room(self, prompt_ids: list[int], budget: int) -> int:
        """How many tokens a completion after this prompt may have within a response of `budget` tokens."""
        if not self.continues(prompt_ids):
            return budget
        keep, added = self._split(prompt_ids)
        return budget - keep - len(added)

    def add(self, prompt_ids: list[int], completion: list[int], logps: list[float] | None) -> None:
        """One call's prompt and completion (with the engine's log-probs of the completion, or None) stitched in."""
        completion = list(completion)
        if self.continues(prompt_ids):
            keep, added = self._split(prompt_ids)
        else:
            self.restarts += int(self.calls > 0)
            self.prompt, keep, added = list(prompt_ids), 0, []
        self.ids = self.ids[:keep] + added + completion
        self.mask = self.mask[:keep] + [0] * len(added) + [1] * len(completion)
        self.logps = self.logps[:keep] + [0.0] * len(added) + (list(logps) if logps else [0.0] * len(completion))
        self.with_logps = self.with_logps and logps is not None
        self.calls += 1
