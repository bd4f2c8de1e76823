"""The entrypoint's exception types; each user-facing one carries the process exit code it ends with."""


class RigError(Exception):
    """A problem with the user's environment, input or cluster, with the fix in the message."""

    exit_code = 2


HANG_EXIT = 5  # the trainer's watchdog found a phase past its limit (trainer/driver/watchdog.py)


class NodeLost(RigError):
    """A node of a formed cluster went away while the job ran; `ranks`: which (node ranks), where known."""

    exit_code = 3

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = ranks or []


class FabricFailed(RigError):
    """The fabric check's verdict was a failure; `ranks`: the node ranks it named."""

    def __init__(self, message: str, ranks: list[int] | None = None):
        super().__init__(message)
        self.ranks = ranks or []


class Unreachable(ConnectionError):
    """The head's key-value store did not answer. Never shown as such: callers retry or turn it into
    NodeLost/RigError, so it must stay distinct from bugs, which propagate."""
