"""One exception type for user-facing failures: rendered as one line, exit code 2."""


class RigError(Exception):
    """A problem with the user's environment, input or cluster, with the fix in the message."""

    exit_code = 2
