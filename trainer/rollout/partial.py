"""A prompt's samples in the making across weight syncs: the fully async mode's partial rollouts
(async_training.partial_rollout, verl's). A sync interrupts a generation at a token boundary; each sample keeps the
tokens it has, with the log-probs of the weights that drew each of them, and goes on under the new weights.

The log-probs of a sample finished this way come from two or more policies, token by token (the behaviour policy
of each token), which is what the off-policy correction compares against.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .engines.base import Rollout, pack_responses


@dataclass
class Partial:
    index: int  # the prompt's place in the data set
    prompt: list[int]
    tokens: list[list[int]]  # per sample
    logps: list[list[float]]
    done: list[bool]
    versions: list[int] = field(default_factory=list)  # the weight versions that drew its tokens, in order

    @classmethod
    def fresh(cls, index: int, prompt: list[int], n: int) -> Partial:
        return cls(index, prompt, [[] for _ in range(n)], [[] for _ in range(n)], [False] * n)

    def going(self) -> list[int]:
        return [k for k, d in enumerate(self.done) if not d]

    @property
    def finished(self) -> bool:
        return all(self.done)

    def extend(self, k: int, tokens: list[int], logps: list[float], finished: bool) -> None:
        self.tokens[k] += tokens
        self.logps[k] += logps
        self.done[k] = finished

    def drawn_with(self, version: int) -> None:
        if not self.versions or self.versions[-1] != version:
            self.versions.append(version)


# what a partial-rollout call's items are: single-turn token streams (Partial), rlrig's multi-turn trajectories
# (agent/partial.py AgentPartial), loops of your own held by the engine's worker (agent/own_partial.py LoopPartial)
TOKENS, TURNS, OWN = "tokens", "turns", "own"


@dataclass
class Progress:
    """What a partial-rollout call gives back: the prompts it finished, as (index, the weight versions that drew
    them), and their samples as one Rollout (prompt j's at rows j*n ..); the unfinished items, to go on later; the
    seconds it took; and, for multi-turn items, each sample's agent-loop fields (for its reward) and its turn
    record (the loop's metrics), row for row with the Rollout."""

    ended: list[tuple[int, list[int]]]
    rollout: Rollout | None
    going: list
    secs: float
    turns: list[dict] = field(default_factory=list)
    records: list[dict] = field(default_factory=list)


def packed(items: list[Partial], max_new: int, pad_id: int, eos_id: int) -> Rollout:
    """Finished items' samples as one Rollout, item j's at rows j*n .. j*n+n-1: one set of tensors for a call's
    prompts, not one per prompt, which the trip to the driver pays for in pickling."""
    n = len(items[0].tokens)
    tokens = [t for it in items for t in it.tokens]
    logps = [lp for it in items for lp in it.logps]
    return pack_responses([it.prompt for it in items], n, tokens, logps, max_new, pad_id, eos_id)


def go_on(engine, items: list[Partial], max_new: int, stopped, logprobs, version: int) -> None:
    """Every unfinished sample of `items` a step further with `engine` (an interruptible one) under the weights of
    `version`: until each ends (EOS, or max_new tokens in all) or stopped() halts them all at a token boundary.
    logprobs(rollout) gives the current weights' log-probs of a rollout's response tokens, for an engine that reports
    none."""
    rows = [(it, k) for it in items for k in it.going()]
    seqs = [it.prompt + it.tokens[k] for it, k in rows]
    # a rank of a tensor-parallel engine may have none of the engine's prompts, and still takes part
    budget = max_new - min((len(it.tokens[k]) for it, k in rows), default=0)
    ro, ended = engine.generate_until(seqs, budget, stopped)
    logp = ro.engine_logp if ro.engine_logp is not None else logprobs(ro)  # vLLM's own, per token
    for i, (it, k) in enumerate(rows):
        kept = ro.response_mask[i].bool()
        room = max_new - len(it.tokens[k])
        new = ro.input_ids[i, ro.prompt_len :][kept].tolist()[:room]
        # done: the engine ended it (an end token), or it has the whole response length
        it.extend(k, new, logp[i][kept].tolist()[:room], ended[i] or len(new) == room)
    for it in items:
        it.drawn_with(version)
