"""What a failed multi-node test shows: the end of the log, and where a crash began if that is earlier.

A Ray worker that segfaults prints a long native stack; the end of the log alone holds only its last frames,
never the signal, the thread or the first frames, which name the cause."""

import re

CRASH = re.compile(r"\*\*\* SIG[A-Z]+ received|Fatal Python error|Traceback \(most recent call last\)|Check failed")


def excerpt(text: str, tail: int = 3000, lines: int = 40) -> str:
    start = len(text) - tail
    m = CRASH.search(text)
    if m is None or m.start() >= start:
        return text[-tail:]
    head = text.rfind("\n", 0, m.start()) + 1
    first = "\n".join(text[head:].splitlines()[:lines])
    return f"{first}\n[...]\n{text[-tail:]}"
