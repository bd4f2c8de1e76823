"""The interactions of an interaction config file (multi_turn.interaction_config_path), in verl's format:

    interaction:
      - name: gsm8k                       # optional: else the class name without "Interaction", lower case
        class_name: rlrig.trainer.agent.interactions.gsm8k.Gsm8kInteraction
        config: {}                        # handed to the interaction, with its name added

verl's own interaction classes, named by their verl paths, load rlrig's ports."""

from __future__ import annotations

from ...errors import ConfigError
from ..loading import import_class, read_entries
from .base import BaseInteraction

__all__ = ["BaseInteraction", "load_interactions"]

VERL_PORTS = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "rlrig.trainer.agent.interactions.gsm8k.Gsm8kInteraction"
}


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    """The file's interactions by name, each built once; a ConfigError names the entry that is wrong."""
    out: dict[str, BaseInteraction] = {}
    for i, entry in enumerate(read_entries(path, "interaction")):
        where = f"multi_turn.interaction_config_path={path}: interaction[{i}]"
        class_name = entry.get("class_name")
        cls = import_class(VERL_PORTS.get(class_name, class_name), where, BaseInteraction)
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{where}: config must be a mapping")
        name = entry.get("name")
        if name is None:
            simple = class_name.rsplit(".", 1)[-1]
            name = (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()
        if name in out:
            raise ConfigError(f"{where}: a second interaction named {name}; names must differ")
        out[name] = cls(config={**config, "name": name})
    return out
