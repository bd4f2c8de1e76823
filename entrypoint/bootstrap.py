"""From the process environment to a validated node: detection, addresses, preflight."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from . import addresses, inventory, launchers, preflight, raystart
from .nodespec import NodeSpec


@dataclass
class Node:
    spec: NodeSpec
    pf: preflight.Preflight
    temp_dir: str


def prepare(env: Mapping[str, str] | None = None, launcher: str | None = None, temp_override: str | None = None) -> Node:
    env = dict(os.environ if env is None else env)
    spec = launchers.detect(env, launcher)
    if spec.existing_ray:
        return Node(spec, preflight.Preflight(), "")
    temp = raystart.temp_dir(spec, env, temp_override)
    inv = inventory.collect(temp)
    addresses.resolve_spec(spec, inv.interfaces)
    return Node(spec, preflight.run(spec, env, inv, temp_dir=temp), temp)
