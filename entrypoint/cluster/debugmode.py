"""`--debug`: Ray's debuggers are chosen by variables its workers read when they start, so they must be in
the environment of `ray start` on every node (verl's FAQ); setting them in a job is too late.

post-mortem: RAY_DEBUG_POST_MORTEM=1, Ray's distributed debugger (debugpy; the `debug` extra): a task
             that raises waits for a debugger (VS Code's Ray Distributed Debugger) instead of failing.
             The FAQ: remove the legacy flags first, so they are refused beside it.
legacy:      RAY_DEBUG=legacy and `ray start --ray-debugger-external`: breakpoint() waits for `ray debug`.
Either way, a waiting breakpoint listens on the node's IP without the cluster token: debug on a network
you trust.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import RigError

MODES = ("post-mortem", "legacy")
POST_MORTEM, LEGACY = MODES


def debug_env(mode: str | None) -> dict[str, str]:
    if mode is None:
        return {}
    if mode == POST_MORTEM:
        return {"RAY_DEBUG_POST_MORTEM": "1"}
    if mode == LEGACY:
        return {"RAY_DEBUG": "legacy"}
    raise RigError(f"--debug {mode}: unknown; choose one of: {', '.join(MODES)}")


def check(env: Mapping[str, str]) -> None:
    """Refuse post-mortem beside the legacy debugger: Ray would use the legacy one and never wait post mortem."""
    if env.get("RAY_DEBUG_POST_MORTEM", "0") not in ("", "0") and env.get("RAY_DEBUG") == "legacy":
        raise RigError(
            "RAY_DEBUG_POST_MORTEM=1 and RAY_DEBUG=legacy are both set; the post-mortem debugger needs the legacy "
            "flags removed: unset RAY_DEBUG (or use --debug legacy without RAY_DEBUG_POST_MORTEM)"
        )


def debugger_external(env: Mapping[str, str]) -> bool:
    """The legacy debugger must listen beyond loopback for `ray debug` on the head to reach other nodes."""
    return env.get("RAY_DEBUG") == "legacy"
