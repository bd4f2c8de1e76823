"""A node's process with its output collected as it runs: shared by the integration tests and bench/."""

import subprocess
import threading
import time


class NodeProc:
    """One node's process (an entrypoint in a namespace), with its output collected line by line."""

    def __init__(self, cmd: list[str], env: dict[str, str]):
        self.lines: list[str] = []
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> float:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.saw(text):
                return time.monotonic()
            if self.proc.poll() is not None:
                self.thread.join(2)
                if self.saw(text):
                    return time.monotonic()
                raise AssertionError(f"exited {self.proc.returncode} before {text!r}:\n{self.output}")
            time.sleep(0.1)
        raise AssertionError(f"no {text!r} within {timeout}s:\n{self.output}")

    def wait(self, timeout: float) -> int:
        """The node's exit code; an AssertionError with what it printed where it has not ended within `timeout`."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"not ended within {timeout}s:\n{self.output}") from None
        self.thread.join(5)
        return code

    def kill(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
