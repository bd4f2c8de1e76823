"""An interaction as verl defines one (verl/interactions/base.py): a simulated user who reads the model's turn and
answers it, may end the conversation, and scores the turn. A row picks one by extra_info.interaction_kwargs.name;
the rest of interaction_kwargs reach start_interaction and generate_response."""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    """verl's interaction interface. A subclass is named by its module path in the interaction config and built
    once per worker with its entry's config (its `name` added). The tool agent loop calls, for each sample whose row
    names it, start_interaction once, generate_response after each of the model's turns that makes no tool call
    (and hits no turn or length limit), and finalize_interaction when the sample ends; the methods are coroutines,
    awaited together for the batch's samples, so an instance keeps each sample's state under its instance_id."""

    def __init__(self, config: dict):
        self.config = config
        self.name = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        """Begin a conversation: the id its later calls name (the loop passes the request id). kwargs: the row's
        extra_info.interaction_kwargs."""
        return instance_id or str(uuid.uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict]:
        """The user's answer to the conversation so far (`messages`, the model's last turn at the end): (whether
        the conversation ends here, the user's reply, this turn's score or None, metrics). The reply is the next user
        message; the score is kept as the turn's (turn_scores)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        """The conversation's score so far: verl's interface, for the interaction's own use (the loop does not
        call it)."""
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        """The sample has ended: release what the conversation holds."""
