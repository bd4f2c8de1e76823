"""The installed Ray against the releases rlrig works with: the one place that names them.

The floor is token authentication: every node, driver and client runs with RAY_AUTH_MODE=token and catches
ray.exceptions.AuthenticationError, and both first ship in Ray 2.52 (2.50 and 2.51 know neither, so a cluster
would start without auth and then fail on the import). The ceiling is the newest release line tested here;
a newer one is allowed with a warning. pyproject.toml's `ray[default]` bound says the same (a unit test holds
them together).
"""

from __future__ import annotations

import re
from importlib import metadata

from ..errors import RigError
from .checks import FAIL, PASS, WARN, Preflight

MINIMUM = (2, 52)
TESTED = (2, 60)  # the newest release line tested: every 2.60.x
NAME = "ray"


def _dotted(release: tuple[int, ...]) -> str:
    return ".".join(map(str, release))


# what pyproject.toml requires: from the minimum up to the release line after the tested one
REQUIREMENT = f"ray[default]>={_dotted(MINIMUM)},<{_dotted((TESTED[0], TESTED[1] + 1))}"
FIX = f"pip install 'ray[default]>={_dotted(MINIMUM)}'"
TESTED_RANGE = f"{_dotted(MINIMUM)} to {_dotted(TESTED)}.x"


def installed() -> str | None:
    """The version of the Ray distribution this Python imports, or None when there is none."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


def release(version: str) -> tuple[int, int] | None:
    """(major, minor) of a version string; a pre-release or dev build counts as its release line."""
    m = re.match(r"\s*v?(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def verdict(version: str | None) -> tuple[str, str]:
    """(status, message) for the installed Ray's version."""
    if version is None:
        return FAIL, f"Ray is not installed in this Python environment; {FIX}"
    line = release(version)
    if line is None:
        return WARN, f"cannot read Ray's version {version!r}; rlrig is tested with Ray {TESTED_RANGE}"
    if line < MINIMUM:
        return (
            FAIL,
            f"Ray {version} is installed but rlrig needs Ray >= {_dotted(MINIMUM)} (token authentication, "
            f"RAY_AUTH_MODE=token); {FIX}",
        )
    if line > TESTED:
        return (
            WARN,
            f"Ray {version} is newer than the releases rlrig is tested with ({TESTED_RANGE}); "
            f"if something breaks, pip install '{REQUIREMENT}'",
        )
    return PASS, f"Ray {version} (tested {TESTED_RANGE})"


def check(version: str | None, pf: Preflight) -> None:
    pf.add(NAME, *verdict(version))


def refuse_old(version: str | None) -> None:
    """For the commands that only talk to a cluster (submit, status, down): a RigError when Ray is too old."""
    status, message = verdict(version)
    if status == FAIL:
        raise RigError(message)
