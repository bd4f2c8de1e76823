"""A real two-node Slurm (Debian's slurm-wlm) on network-namespace hosts, for integration tests.

slurmctld runs in the root namespace on the bridge address; one slurmd per namespace, entered with
`nsenter --net` because `ip netns exec` remounts /sys and slurmd needs the host's. The config lives
in a temp dir named by SLURM_CONF, which slurmctld, slurmd, srun and sbatch all honour, so nothing
under /etc/slurm is touched. Node names carry a per-run tag and reach /etc/hosts only for the run.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from rlrig.entrypoint.cluster.ports import kernel_free_port
from tests.helpers import netns

DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "nsenter")
HOSTS = Path("/etc/hosts")


def available() -> str | None:
    """None when a Slurm can be started here, else why not."""
    why = netns.available()
    if why:
        return why
    missing = [d for d in DAEMONS if not shutil.which(d)]
    if missing:
        return f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge util-linux)"
    if not Path("/etc/munge/munge.key").exists():
        return "/etc/munge/munge.key is missing (the munge package creates it)"
    return None


def _munge_running(sock: Path) -> bool:
    return subprocess.run(["munge", "-n", f"--socket={sock}"], capture_output=True).returncode == 0


class Slurm:
    """`with Slurm(2) as s:` gives nodes s.names on s.ns; s.env has SLURM_CONF for srun/sbatch."""

    def __init__(self, n: int = 2, subnet: int = 230, cpus: int | None = None):
        self.ns = netns.Netns(n, subnet=subnet)
        self.cpus = cpus or os.cpu_count() or 1
        self.names = [f"rls{self.ns.tag}n{i + 1}" for i in range(n)]
        self.dir = Path(tempfile.mkdtemp(prefix="rlslurm"))
        self.procs: list[subprocess.Popen] = []
        self.munged: subprocess.Popen | None = None
        self.hosts_line = ""

    @property
    def nodelist(self) -> str:
        return f"rls{self.ns.tag}n[1-{len(self.names)}]"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.dir / "slurm.conf")}

    def _write_conf(self) -> None:
        d = self.dir
        (d / "state").mkdir()
        (d / "spool").mkdir()
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={self.ns.ip(i)} CPUs={self.cpus} RealMemory=2000 State=UNKNOWN"
            for i, name in enumerate(self.names)
        )
        # slurmctld listens in the root namespace, where another suite's controller may hold any fixed port
        (d / "slurm.conf").write_text(f"""ClusterName=rlrig{self.ns.tag}
SlurmctldHost={socket.gethostname()}({self.ns.bridge_ip})
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={d}/munge.socket
SlurmctldPort={kernel_free_port()}
SlurmdPort=16818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
MailProg=/bin/true
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
{nodes}
PartitionName=rl Nodes={self.nodelist} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n")

    def __enter__(self) -> Slurm:
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        self.ns.__enter__()
        self._write_conf()
        self.hosts_line = "".join(f"{self.ns.ip(i)} {name}\n" for i, name in enumerate(self.names))
        with HOSTS.open("a") as f:
            f.write(self.hosts_line)
        # a munged of this cluster's own, on a socket in its directory (slurm.conf's AuthInfo), logging beside the
        # daemons: one shared on /run/munge was found gone in the middle of a test, by no cause its absent log
        # could tell, and srun then waits without end on a job it cannot complete
        d = self.dir
        files = [f"--socket={d}/munge.socket", f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"]
        self.munged = subprocess.Popen(
            ["munged", "--foreground", "--force", *files, f"--log-file={d}/munged.log"], stderr=subprocess.DEVNULL
        )
        self._until(lambda: _munge_running(d / "munge.socket"), 20, "munged did not start")
        log = (self.dir / "daemons.log").open("ab")
        self.procs.append(subprocess.Popen(["slurmctld", "-D", "-i"], env=self.env, stdout=log, stderr=log))
        for i, name in enumerate(self.names):
            cmd = ["nsenter", f"--net=/var/run/netns/{self.ns.names[i]}", "slurmd", "-D", "-N", name]
            self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=log))
        self._until(self._nodes_idle, 60, "Slurm nodes did not become idle")

    def _nodes_idle(self) -> bool:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
        states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
        return all(states.get(name) == "idle" for name in self.names)

    def _until(self, ok, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ok():
                return
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{what}: {p.args[0]} exited {p.returncode}\n{self.logs()}")
            time.sleep(0.5)
        raise RuntimeError(f"{what} within {timeout}s\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.dir.glob("*.log"))
        )

    def run(self, *args: str, timeout: float = 600, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), env={**self.env, **kw.pop("env", {})}, capture_output=True, text=True, timeout=timeout, **kw
        )

    def _kill_step_daemons(self) -> None:
        """The slurmstepd processes of this cluster's job steps, by the SLURM_CONF they inherited: a step whose srun was
        killed (a test past its timeout) outlives scancel and its slurmd, which no longer hears of it."""
        import psutil

        mine = f"SLURM_CONF={self.env['SLURM_CONF']}".encode()
        for proc in psutil.process_iter(["name"]):
            try:
                if (proc.info["name"] or "").startswith("slurmstepd"):
                    # read raw: slurmstepd writes its title over the start of its environment, where psutil's
                    # environ() then finds no SLURM_CONF
                    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
                    if mine in environ:
                        proc.kill()
            except (psutil.Error, OSError):
                pass

    def __exit__(self, *exc) -> None:
        subprocess.run(["scancel", "--full", "-p", "rl"], env=self.env, capture_output=True)
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        self._kill_step_daemons()
        if self.munged:
            self.munged.terminate()
            self.munged.wait(10)
        if self.hosts_line:
            text = HOSTS.read_text()
            HOSTS.write_text(text.replace(self.hosts_line, ""))
        self.ns.__exit__(None, None, None)
        shutil.rmtree(self.dir, ignore_errors=True)
