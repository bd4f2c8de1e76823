"""The trainer's one error for bad input (config, data, files, a user's code): main prints its message as one line
and exits 2. Anything else is a bug and shows its traceback."""

import traceback


class ConfigError(ValueError):
    pass


def first_line(e: BaseException) -> str:
    """An exception's message, its first line only (what the one-line error quotes)."""
    return (str(e).splitlines() or [""])[0]


def raised_where(e: BaseException) -> str:
    """` at FILE:LINE` of the innermost frame that raised `e` (a user's code, where it raised), or ""."""
    frames = traceback.extract_tb(e.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
