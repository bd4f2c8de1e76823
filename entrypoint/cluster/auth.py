"""Ray token authentication: where the cluster token comes from."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

from ..errors import RigError

MAKE_ONE = "export RLRIG_CLUSTER_TOKEN=$(rlrig token) and pass the same value to every node"


# First set wins: rlrig's own variables before Ray's, so an explicit choice beats a token Ray's
# tooling left in the environment; a value before a file of the same family.
SOURCES = (
    ("RLRIG_CLUSTER_TOKEN", False),
    ("RLRIG_CLUSTER_TOKEN_FILE", True),
    ("RAY_AUTH_TOKEN", False),
    ("RAY_AUTH_TOKEN_PATH", True),
)


def resolve_token(env: Mapping[str, str], nnodes: int, shared: bool = False) -> tuple[str, str]:
    """(token, where it came from). A single node may make its own; several must share one, and so must
    a standing cluster (`shared`) with whoever submits to it."""
    found = _from_sources(env)
    if found:
        return found
    if shared:
        raise RigError(f"rlrig up needs a token that you also give to rlrig submit; {MAKE_ONE} and to rlrig submit")
    if nnodes > 1:
        raise RigError(f"a {nnodes}-node cluster needs a shared token and none is set; {MAKE_ONE}")
    return new_token(), "generated (single node)"


def client_token(env: Mapping[str, str], home: Path | None = None) -> tuple[str, str]:
    """The token `rlrig submit/status/down` send: the variables, then Ray's own token file, which
    `ray job submit` reads too."""
    found = _from_sources(env)
    if found:
        return found
    ray_file = (home or Path.home()) / ".ray" / "auth_token"
    if ray_file.is_file() and ray_file.read_text().strip():
        return ray_file.read_text().strip(), str(ray_file)
    raise RigError(
        "no cluster token to send; export RLRIG_CLUSTER_TOKEN with the token the cluster was started with "
        "(or RLRIG_CLUSTER_TOKEN_FILE, RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH)"
    )


def _from_sources(env: Mapping[str, str]) -> tuple[str, str] | None:
    for var, is_file in SOURCES:
        value = env.get(var, "").strip()
        if not value:
            continue
        if not is_file:
            return value, var
        try:
            token = Path(value).read_text().strip()
        except OSError as e:
            raise RigError(
                f"{var}={value} cannot be read ({e.strerror}); point it at the token file or {MAKE_ONE}"
            ) from None
        if not token:
            raise RigError(f"{var}={value} is empty; {MAKE_ONE}")
        return token, var
    return None


def new_token() -> str:
    return secrets.token_hex(32)


def ray_auth_env(token: str) -> dict[str, str]:
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
