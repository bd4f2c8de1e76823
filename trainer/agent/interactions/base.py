"""An interaction as verl defines one (verl/interactions/base.py): a simulated user who reads the model's turn and
answers it, may end the conversation, and scores the turn. A row picks one by extra_info.interaction_kwargs.name;
the rest of interaction_kwargs reach start_interaction and generate_response."""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    def __init__(self, config: dict):
        self.config = config
        self.name = config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id or str(uuid.uuid4())

    async def generate_response(
        self, instance_id: str, messages: list[dict[str, Any]], **kwargs
    ) -> tuple[bool, str, float, dict]:
        """(whether the conversation ends here, the user's reply, this turn's score, metrics)."""
        return False, "Your current result seems acceptable.", 0.8, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        pass
