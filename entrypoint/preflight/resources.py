"""RLRIG_RESOURCES: this node's custom Ray resources, as `ray start --resources` takes them.

Per node on purpose (one machine `{"v100": 1}`, another `{"h100": 1}`): each node reads its own
environment, then its own .env file, never the head's. Validated before anything starts, so a typo
fails in one line here instead of deep inside `ray start`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from ..detect import clusterenv
from ..errors import RigError
from .checks import FAIL, PASS, Preflight

VAR = "RLRIG_RESOURCES"
EXAMPLE = f"""{VAR}='{{"v100": 1}}'"""
# Ray's own resource names, each with who sets it instead
RESERVED = {
    "CPU": "rlrig sets it with --num-cpus from RLRIG_NUM_CPUS (default: the allocation, CPU affinity and cgroup quota)",
    "GPU": (
        "rlrig sets it with --num-gpus from the visible GPUs (CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES) "
        "and RLRIG_NUM_GPUS"
    ),
    "memory": "Ray sizes it from this node's memory",
    "object_store_memory": (
        "rlrig sets it with --object-store-memory to fit /dev/shm (raise the container's --shm-size for more)"
    ),
}
RESERVED_PREFIXES = {
    "node:": "Ray names every node node:<ip> itself",
    "accelerator_type:": "Ray sets accelerator_type:<model> itself from the GPU",
}
JSON_TYPES = {
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "a number",
    float: "a number",
    type(None): "null",
}


def lookup(env: Mapping[str, str], env_file: str | None) -> tuple[str | None, str]:
    """(value, where it came from); this node's environment wins over its .env file, empty is unset."""
    if env.get(VAR, "").strip():
        return env[VAR], "environment"
    if env_file:
        value = clusterenv.file_values(env_file).get(VAR) or ""
        if value.strip():
            return value, env_file
    return None, ""


def _reserved(name: str) -> str | None:
    """Who sets `name` when Ray reserves it, else None."""
    if name in RESERVED:
        return RESERVED[name]
    return next((why for prefix, why in RESERVED_PREFIXES.items() if name.startswith(prefix)), None)


def _amount_ok(value) -> bool:
    # bool is an int to Python but `true` is no amount; NaN and Infinity are JSON to Python, not to Ray
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def parse(raw: str, source: str = "environment") -> dict[str, float]:
    """The resources in `raw`, or a RigError in one line naming RLRIG_RESOURCES and the fix."""
    given = f"{VAR}={raw!r}" + ("" if source == "environment" else f" (in {source})")
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise RigError(
            f"{given} is not JSON ({e.msg} at column {e.colno}); "
            f"write a JSON object of resource amounts, e.g. {EXAMPLE}"
        ) from None
    if not isinstance(value, dict):
        raise RigError(
            f"{given} is {JSON_TYPES.get(type(value), 'not an object')}, not a JSON object; "
            f"write one name per resource with its amount, e.g. {EXAMPLE}"
        )
    for name, amount in value.items():
        if not name.strip():
            raise RigError(f"{given}: a resource without a name; name each one, e.g. {EXAMPLE}")
        why = _reserved(name)
        if why:
            raise RigError(f"{given}: {name} is reserved by Ray: {why}; remove it from {VAR}")
        if not _amount_ok(amount):
            raise RigError(
                f"{given}: {name} is {json.dumps(amount)}, not a non-negative number; "
                f"give each resource an amount, e.g. {VAR}='{{{json.dumps(name)}: 1}}'"
            )
    return value


def check(env: Mapping[str, str], env_file: str | None, pf: Preflight) -> None:
    """Into `pf`: the custom resources, and a check when RLRIG_RESOURCES is set (or unreadable)."""
    try:
        raw, source = lookup(env, env_file)
        if raw is None:
            return
        pf.custom_resources = parse(raw, source)
    except RigError as e:  # a failed check, so that `rlrig doctor` goes on and shows the rest
        pf.add(VAR, FAIL, str(e))
        return
    pf.add(VAR, PASS, f"{summary(pf.custom_resources) or 'no resources'} (from {source})")


def summary(resources: Mapping[str, float]) -> str:
    """`CPU 8, GPU 2, v100 1`: CPU and GPU first; Ray's per-node `node:<ip>` names left out, as are the
    byte counts (memory, object store), which would drown the rest."""
    shown = {
        k: v for k, v in resources.items() if not k.startswith("node:") and k not in ("memory", "object_store_memory")
    }
    order = sorted(shown, key=lambda k: (k not in ("CPU", "GPU"), k != "CPU", k))
    return ", ".join(f"{k} {shown[k]:g}" for k in order)
