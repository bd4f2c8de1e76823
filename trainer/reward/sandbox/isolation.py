"""How a submission's process is walled off, chosen once at start-up from what this machine allows, and the
child-side setup that applies it between fork and exec.

As root: each concurrency slot runs as a uid of its own (SLOT_UID_BASE + slot, no supplementary groups), in new
network and mount namespaces (no network but a loopback that is down; /tmp, /var/tmp and /dev/shm are empty
tmpfs of its own). Not root: new user + network (+ mount) namespaces where unprivileged user namespaces are
allowed; else Python submissions get an audit hook that refuses sockets, and other languages keep the network
(said at start-up)."""

from __future__ import annotations

import ctypes
import os
import resource
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET = 0x00020000, 0x10000000, 0x40000000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000
SLOT_UID_BASE = 61000  # slot k runs as uid 61000 + k: its processes and files are its own
PRIVATE_DIRS = (b"/tmp", b"/var/tmp", b"/dev/shm")

_libc = ctypes.CDLL(None, use_errno=True)

# Python submissions without a network namespace: sitecustomize adds an audit hook, which code cannot remove
_NO_SOCKETS = """import sys
def _refuse(event, args):
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
        raise PermissionError("network access is refused in rlrig sandbox")
sys.addaudithook(_refuse)
"""


@dataclass(frozen=True)
class Isolation:
    """What the child does before exec: `unshare` flags, whether it mounts private temp dirs, whether it drops to
    a slot's own uid (root only); `hook_dir` holds the sitecustomize that refuses sockets where no network
    namespace can be made (None where one is)."""

    flags: int
    private_tmp: bool
    own_uid: bool
    hook_dir: str | None

    def describe(self) -> str:
        net = (
            "no network (a network namespace of its own)"
            if self.flags & CLONE_NEWNET
            else "network NOT isolated (no namespace can be made here): Python submissions' sockets are refused by "
            "an audit hook, other languages' are not"
        )
        who = (
            f"its own uid ({SLOT_UID_BASE}+slot): files outside its scratch directory are read-only to it"
            if self.own_uid
            else "this user's uid: it can write wherever this user can"
        )
        tmp = "private /tmp, /var/tmp, /dev/shm" if self.private_tmp else "the machine's /tmp"
        return f"each submission runs as {who}; {net}; {tmp}"

    def uid(self, slot: int) -> int | None:
        return SLOT_UID_BASE + slot if self.own_uid else None


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def enter(iso: Isolation, uid: int | None, limits: dict[int, int]) -> None:
    """In the child, between fork and exec (cwd already the scratch directory): namespaces, private temp dirs,
    resource limits, then the slot's uid last (setting limits and namespaces needs the privileges it drops)."""
    if iso.flags:
        _check(_libc.unshare(iso.flags), "unshare")
    if iso.private_tmp:
        _check(_libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
        for d in PRIVATE_DIRS:
            if os.path.isdir(d):
                _check(_libc.mount(b"tmpfs", d, b"tmpfs", MS_NOSUID | MS_NODEV, b"size=64m,mode=1777"), "mount tmpfs")
    for which, value in limits.items():
        resource.setrlimit(which, (value, value))
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def work_dir(root: bool) -> Path:
    """A fresh directory for the sandbox's scratch directories, outside the temp dirs a submission gets private
    copies of (its cwd must stay reachable by path there), and searchable by the slots' uids as root."""
    home = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    for base in [Path("/run"), Path("/var/lib")] if root else [home]:
        if base.is_dir() and os.access(base, os.W_OK):
            base = base / "rlrig-sandbox"
            base.mkdir(mode=0o711, parents=True, exist_ok=True)
            base.chmod(0o711)
            made = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=base))
            made.chmod(0o711)
            return made
    return Path(tempfile.mkdtemp(prefix="rlrig-sandbox-"))


def _works(iso: Isolation) -> bool:
    try:
        done = subprocess.run(["true"], preexec_fn=lambda: enter(iso, iso.uid(0), {}), timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def detect(work_dir: Path) -> Isolation:
    """The strongest isolation this process can make, tried in order (each probe starts `true` under it)."""
    root = os.geteuid() == 0
    base = CLONE_NEWNET | CLONE_NEWNS if root else CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWNS
    for flags, private in ((base, True), (base & ~CLONE_NEWNS, False)):
        iso = Isolation(flags, private, root, None)
        if _works(iso):
            return iso
    hook = work_dir / "nosockets"
    hook.mkdir(mode=0o755, exist_ok=True)
    (hook / "sitecustomize.py").write_text(_NO_SOCKETS)
    (hook / "sitecustomize.py").chmod(0o644)
    return Isolation(0, False, root and _works(Isolation(0, False, True, None)), str(hook))


def processes_of(uid: int) -> list[int]:
    """The pids of every process whose real uid is `uid` (a slot's leftovers, whatever their process group)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
        except OSError:
            continue
        # a zombie is gone but for its parent's wait: nothing to kill
        if int(fields.get("Uid", "-1 ").split()[0]) == uid and not fields.get("State", "").strip().startswith("Z"):
            pids.append(int(entry.name))
    return pids


def kill_all(uid: int, rounds: int = 100) -> None:
    """SIGKILL every process of a slot's uid until none is left (a fork bomb forks while it is being killed)."""
    for _ in range(rounds):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
