"""multi_turn.tokenization_sanity_check_mode, as verl's multi-turn rollout checks: a finished sample's tokens (the
prompt, the model's own tokens and the templated deltas between them, agent/chat.py) against its whole conversation
put through the chat template at once. A template whose deltas do not add up to the whole (one that drops past
reasoning, or spaces turns differently) trains the model on a context it would not see from that template at
inference; the check says where, with verl's warning and its 10 characters of context either side of each difference.

strict: any difference is reported; ignore_strippable: only one with more than whitespace in it, as verl's docs say
(its code strips each difference with its context, which leaves almost none ignorable); disable: no check.
Not a difference: what the template writes after the sample's last token (the end of its last turn, a turn that
data.max_response_length cut), which nothing was trained on."""

from __future__ import annotations

import difflib
import sys
from dataclasses import dataclass

from .chat import template_ids

CONTEXT = 10  # characters either side of a difference, verl's diff_surrounding_chars


@dataclass(frozen=True)
class Diff:
    full: tuple[int, int]  # characters of the whole conversation's text
    ours: tuple[int, int]  # characters of the sample's own text
    full_chunk: str  # the differing text of each (as shown: with_context's, CONTEXT characters either side)
    ours_chunk: str

    def strippable(self) -> bool:
        return not self.full_chunk.strip() and not self.ours_chunk.strip()

    def __str__(self) -> str:
        (i1, i2), (j1, j2) = self.full, self.ours
        chunks = f"full_prompt_chunk: {self.full_chunk!r} | current_prompt_chunk: {self.ours_chunk!r}"
        return f"idx {i1}:{i2} -> {j1}:{j2} | {chunks}"


def diffs(full: str, ours: str) -> list[Diff]:
    """Where `ours` differs from `full`, bar text `full` has only after `ours` ends."""
    out = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, full, ours, autojunk=False).get_opcodes():
        if tag == "equal" or (tag == "delete" and i2 == len(full) and j1 == len(ours)):
            continue
        out.append(Diff((i1, i2), (j1, j2), full[i1:i2], ours[j1:j2]))
    return out


def reported(found: list[Diff], mode: str) -> bool:
    if mode == "strict":
        return bool(found)
    return any(not d.strippable() for d in found)


def with_context(d: Diff, full: str, ours: str) -> Diff:
    """`d` as shown: CONTEXT characters either side."""
    (i1, i2), (j1, j2) = d.full, d.ours
    return Diff(
        d.full,
        d.ours,
        full[max(0, i1 - CONTEXT) : i2 + CONTEXT],
        ours[max(0, j1 - CONTEXT) : j2 + CONTEXT],
    )


class SanityCheck:
    """One engine's check: the chat template and tools its prompts were made with."""

    def __init__(self, tokenizer, mode: str, template_kwargs: dict, tools: list[dict] | None):
        self.tok, self.mode, self.kwargs, self.tools = tokenizer, mode, dict(template_kwargs), tools

    def sample(self, ids: list[int], conversation: list[dict]) -> list[Diff]:
        """The reported differences of one sample (its prompt and response ids, its messages)."""
        full_ids = template_ids(self.tok, conversation, self.kwargs, self.tools, generation_prompt=False)
        if full_ids[: len(ids)] == ids:  # the common case, and no text to compare
            return []
        full = self.tok.decode(full_ids, skip_special_tokens=False)
        ours = self.tok.decode(ids, skip_special_tokens=False)
        found = diffs(full, ours)
        return [with_context(d, full, ours) for d in found] if reported(found, self.mode) else []

    def __call__(self, samples: list[tuple[list[int], list[dict]]]) -> int:
        """Each sample checked; the first that differs is shown on stderr, as verl's warning. The number that did."""
        if self.mode == "disable":
            return 0
        bad = [found for found in (self.sample(ids, conv) for ids, conv in samples) if found]
        if bad:
            lines = "\n".join(f"  {d}" for d in bad[0])
            print(
                f"rlrig: warning: inconsistent training and inference tokenization detected ({self.mode}) in "
                f"{len(bad)} of {len(samples)} multi-turn samples: their turns' tokens are not what the chat template "
                "makes of the whole conversation, so the model trains on a context it would not see at inference. "
                "Review the chat template (data.apply_chat_template_kwargs), or set "
                "actor_rollout_ref.rollout.multi_turn.tokenization_sanity_check_mode=ignore_strippable|disable. "
                f"The first sample's differences, {CONTEXT} characters either side:\n{lines}",
                file=sys.stderr,
                flush=True,
            )
        return len(bad)
