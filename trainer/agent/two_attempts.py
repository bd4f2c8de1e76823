"""The embedded demonstration of an agent loop of your own (`rlrig train --preset two-attempts`): the model answers,
is told whether it was right, and answers again.

It is written as a loop for verl 0.9 is; only the import line names rlrig's module of verl's names (with verl
installed, `from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register` runs it
unchanged). Both answers are trained on (mask 1), the verdict between them is not (mask 0); the loop scores the
sample itself (reward_score: the mean of the two answers' correctness, so the reward function is not called) and
reports each answer's verdict in extra_fields.
"""

from __future__ import annotations

import re
from typing import Any
from uuid import uuid4

from rlrig.trainer.agent.verl_api import AgentLoopBase, AgentLoopOutput, register

# the verdicts the model reads after its first answer, in the embedded model's alphabet: "+" right, "-" wrong
VERDICT = {True: " +", False: " -"}
ANSWER = re.compile(r"####\s*(-?[\d,.]+)")


def answer(text: str) -> str | None:
    found = ANSWER.findall(text)
    return found[-1].replace(",", "").rstrip(".") if found else None


@register("two_attempts")
class TwoAttemptsLoop(AgentLoopBase):
    """Two answers to one question, with the first one's verdict between them; each answer at most
    `max_tokens_per_attempt` tokens (the config entry's own key; default half the response length)."""

    def __init__(self, *args, max_tokens_per_attempt: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.response_length = self.rollout_config.response_length
        self.per_attempt = max_tokens_per_attempt or self.response_length // 2

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        truth = str(kwargs["reward_model"]["ground_truth"])
        prompt_ids = await self.ct_build_initial_tokens(list(kwargs["raw_prompt"]))
        params = {**sampling_params, "max_tokens": self.per_attempt}
        response_ids, response_mask, logprobs, right = [], [], [], []
        reported = True  # the hf engine reports no log-probs: then the sample has none
        for attempt in range(2):
            out = await self.server_manager.generate(
                request_id=uuid4().hex, prompt_ids=prompt_ids + response_ids, sampling_params=params
            )
            response_ids += out.token_ids
            response_mask += [1] * len(out.token_ids)
            reported = reported and out.log_probs is not None
            logprobs += out.log_probs or [0.0] * len(out.token_ids)
            right.append(answer(self.tokenizer.decode(out.token_ids, skip_special_tokens=True)) == truth)
            if attempt == 0:
                verdict = self.tokenizer.encode(VERDICT[right[0]], add_special_tokens=False)
                response_ids += verdict
                response_mask += [0] * len(verdict)
                logprobs += [0.0] * len(verdict)
        n = self.response_length
        return AgentLoopOutput(
            prompt_ids=prompt_ids,
            response_ids=response_ids[:n],
            response_mask=response_mask[:n],
            response_logprobs=logprobs[:n] if reported else None,
            reward_score=sum(right) / 2,
            num_turns=4,  # question, answer, verdict, answer
            metrics={},
            extra_fields={"first_right": right[0], "second_right": right[1]},
        )
