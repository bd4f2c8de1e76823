"""verl's GSM8K user (verl/interactions/gsm8k_interaction.py): checks the model's last turn strictly (`#### N`),
ends the conversation when it is right, else asks it to reflect and try again; the turn's score is 1.0 or 0.0."""

from __future__ import annotations

from ...reward.rules import gsm8k_score
from .base import BaseInteraction

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    """The GSM8K user: start_interaction takes the row's ground_truth."""

    def __init__(self, config: dict):
        super().__init__(config)
        self._instances: dict[str, dict] = {}

    async def start_interaction(self, instance_id=None, ground_truth=None, **kwargs) -> str:
        """A conversation about the problem whose answer is `ground_truth`."""
        instance_id = await super().start_interaction(instance_id)
        self._instances[instance_id] = {"response": "", "ground_truth": ground_truth, "reward": 0.0}
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        """Ends the conversation with CORRECT and score 1.0 when the model's last turn is right, else asks it to try
        again (INCORRECT, 0.0)."""
        content = next((m.get("content") for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._instances[instance_id]["response"] = content
        reward = await self.calculate_score(instance_id)
        return (True, CORRECT, reward, {}) if reward == 1.0 else (False, INCORRECT, reward, {})

    async def calculate_score(self, instance_id, **kwargs) -> float:
        """1.0 when the model's last turn gives the answer as `#### N`, else 0.0 (verl's strict check)."""
        state = self._instances[instance_id]
        return gsm8k_score(state["response"], state["ground_truth"], method="strict", format_score=0.0, score=1.0)

    async def finalize_interaction(self, instance_id, **kwargs) -> None:
        """Forgets the conversation."""
        self._instances.pop(instance_id, None)
