"""Ray token authentication: where the cluster token comes from."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Mapping

from .errors import RigError

MAKE_ONE = 'export RLRIG_CLUSTER_TOKEN=$(rlrig token) and pass the same value to every node'


def resolve_token(env: Mapping[str, str], nnodes: int) -> tuple[str, str]:
    """(token, where it came from). A single node may make its own; several must share one."""
    for var in ("RLRIG_CLUSTER_TOKEN", "RAY_AUTH_TOKEN"):
        if env.get(var, "").strip():
            return env[var].strip(), var
    for var in ("RLRIG_CLUSTER_TOKEN_FILE", "RAY_AUTH_TOKEN_PATH"):
        path = env.get(var, "").strip()
        if path:
            try:
                token = Path(path).read_text().strip()
            except OSError as e:
                raise RigError(f"{var}={path} cannot be read ({e.strerror}); point it at the token file or {MAKE_ONE}") from None
            if not token:
                raise RigError(f"{var}={path} is empty; {MAKE_ONE}")
            return token, var
    if nnodes > 1:
        raise RigError(f"a {nnodes}-node cluster needs a shared token and none is set; {MAKE_ONE}")
    return new_token(), "generated (single node)"


def new_token() -> str:
    return secrets.token_hex(32)


def ray_auth_env(token: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
