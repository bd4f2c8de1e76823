"""Environment every node and every Ray worker must see: a .env file plus RLRIG_ENV_* variables.

It must be in place before `ray start`: Ray workers inherit the raylet's environment, and
settings such as VLLM_ATTENTION_BACKEND are read when the worker imports the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ..errors import RigError

PREFIX = "RLRIG_ENV_"
# Each node reads these from its own environment and .env (preflight/resources.py); the head's sent to every
# node would show on each worker as if they were its own.
NODE_ONLY = ("RLRIG_RESOURCES",)


def file_values(env_file: str) -> dict[str, str]:
    """A .env file's variables (keys without a value left out)."""
    path = Path(env_file)
    if not path.is_file():
        raise RigError(f"--env-file {env_file} does not exist; create it or drop the option")
    from dotenv import dotenv_values

    return {k: v for k, v in dotenv_values(path).items() if v is not None}


def cluster_env(env: Mapping[str, str], env_file: str | None) -> dict[str, str]:
    """The .env file's values, then RLRIG_ENV_FOO=bar as FOO=bar (which wins)."""
    out: dict[str, str] = {}
    if env_file:
        out.update({k: v for k, v in file_values(env_file).items() if k not in NODE_ONLY})
    out.update({k[len(PREFIX) :]: v for k, v in env.items() if k.startswith(PREFIX) and len(k) > len(PREFIX)})
    return out


def default_env_file(cwd: Path | None = None) -> str | None:
    path = (cwd or Path.cwd()) / ".env"
    return str(path) if path.is_file() else None
