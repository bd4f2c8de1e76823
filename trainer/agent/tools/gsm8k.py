"""verl's GSM8K answer check as a tool (verl/tools/gsm8k_tool.py): the model submits an answer and reads whether it
parses to the ground truth. Its reward is verl's: 0.0 for an answer better than the instance's last, else -0.05
(a fresh instance per call, so a correct answer gives 0.0 and a wrong one -0.05)."""

from __future__ import annotations

from ...reward.rules import gsm8k_score
from .base import BaseTool, ToolResponse


class Gsm8kTool(BaseTool):
    """`calc_gsm8k_reward(answer)`: whether the answer parses to the ground truth create was given."""

    def __init__(self, config: dict, tool_schema: dict | None = None):
        super().__init__(config, tool_schema)
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self) -> dict:
        """verl's schema for the tool, for a tool config that gives none."""
        return {
            "type": "function",
            "function": {
                "name": "calc_gsm8k_reward",
                "description": "A tool for calculating the reward of gsm8k",
                "parameters": {
                    "type": "object",
                    "properties": {"answer": {"type": "string", "description": "The answer to the question"}},
                    "required": ["answer"],
                },
            },
        }

    async def create(self, instance_id=None, ground_truth=None, **kwargs):
        """An instance for the problem whose answer is `ground_truth` (else create_kwargs' ground_truth)."""
        instance_id, response = await super().create(instance_id)
        if ground_truth is None:
            ground_truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id, response

    async def execute(self, instance_id, parameters, **kwargs):
        """The parsed answer and its score as text; reward 0.0 for an answer better than the instance's last, else
        -0.05."""
        answer = str(parameters.get("answer", ""))
        state = self._instances[instance_id]
        state["response"] = answer if answer.startswith("#### ") else "#### " + answer
        reward = await self.calc_reward(instance_id)
        tool_reward = 0.0 if reward > state["reward"] else -0.05  # verl: no gain is a small penalty
        state["reward"] = reward
        return ToolResponse(text=f"Current parsed {answer=} {reward=}"), tool_reward, {}

    async def calc_reward(self, instance_id, **kwargs) -> float:
        """1.0 when the last answer matches the ground truth (verl's flexible check), else 0.0."""
        state = self._instances[instance_id]
        return gsm8k_score(state["response"], state["ground_truth"], method="flexible", format_score=0.0, score=1.0)

    async def release(self, instance_id, **kwargs) -> None:
        """Forgets the instance."""
        self._instances.pop(instance_id, None)
