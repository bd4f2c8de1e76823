"""Runs sharing a host, jobs sharing nodes: which ports a node takes, whose head a node reached, the host's run
records, and which GPUs other processes compute on (fed NVML's process list as pynvml returns it)."""

import itertools
import os
import socket
import types

import pynvml
import pytest

from rlrig.entrypoint.cluster import identity, ports, raystart, runs
from rlrig.entrypoint.detect.nodespec import NodeSpec
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.preflight import gpu_users
from rlrig.entrypoint.preflight.checks import Preflight
from tests.helpers.entrypoint_fakes import MemoryStore


def counter(start: int = 40000):
    it = itertools.count(start)
    return lambda: next(it)


# (case, choose's arguments, the head ports expected: a dict, "derived" or "free")
CHOICES = [
    ("single node: free", dict(is_head=True, nnodes=1, standing=False, key="local/127.0.0.1", gcs_port=None), "free"),
    ("single node, RLRIG_RAY_PORT", dict(is_head=True, nnodes=1, standing=False, key="k", gcs_port=7000), "gcs7000"),
    ("multi-node head: derived", dict(is_head=True, nnodes=2, standing=False, key="slurm/12.0", gcs_port=None), "der"),
    ("multi-node, RLRIG_RAY_PORT", dict(is_head=True, nnodes=2, standing=False, key="slurm/12.0", gcs_port=7001), "d"),
    ("standing: well known", dict(is_head=True, nnodes=2, standing=True, key="slurm/12.0", gcs_port=None), "known"),
]


@pytest.mark.parametrize("case, kw, head", CHOICES, ids=[c[0] for c in CHOICES])
def test_every_port_a_head_opens_is_chosen(case, kw, head):
    got = ports.choose(**kw, taken={40001}, draw=counter())
    assert set(got) == {*ports.HEAD_PORTS, *ports.NODE_PORTS, *ports.HEAD_ONLY_NODE_PORTS}
    assert len(set(got.values())) == len(got)  # Ray refuses two components on one port
    assert 40001 not in got.values()  # another run here recorded it
    derived = ports.derived_head_ports("slurm/12.0")
    if head == "free":
        assert got["gcs"] >= 40000 and got["dashboard"] >= 40000
    elif head == "gcs7000":
        assert got["gcs"] == 7000
    elif head == "der":
        assert {k: got[k] for k in ports.HEAD_PORTS} == derived
    elif head == "d":
        assert got["gcs"] == 7001 and got["dashboard"] == derived["dashboard"]
    else:
        assert {k: got[k] for k in ports.HEAD_PORTS} == ports.WELL_KNOWN


def test_a_worker_takes_its_own_ports_and_the_heads_gcs():
    got = ports.choose(is_head=False, nnodes=2, standing=False, key="dstack/r1", gcs_port=None, draw=counter())
    assert set(got) == {"gcs", *ports.NODE_PORTS}
    assert got["gcs"] == ports.derived_head_ports("dstack/r1")["gcs"]


@pytest.mark.parametrize(
    "a, b",
    [("slurm/12.0", "slurm/12.1"), ("slurm/12.0", "slurm/13.0"), ("dstack/run-a", "dstack/run-b")],
)
def test_two_jobs_derive_different_ports_and_one_job_the_same(a, b):
    pa, pb = ports.derived_head_ports(a), ports.derived_head_ports(b)
    assert pa == ports.derived_head_ports(a)
    assert set(pa.values()).isdisjoint(pb.values())
    lo, hi = ports.HEAD_RANGE
    assert all(lo <= p <= hi for p in pa.values())  # above Ray's worker ports, below the ephemeral range


def test_derived_ports_spread_over_the_range():
    bases = {ports.derived_head_ports(f"slurm/{i}.0")["gcs"] for i in range(200)}
    assert len(bases) > 170


@pytest.mark.parametrize(
    "launcher, job, head, key",
    [("slurm", "12.0", "n1", "slurm/12.0"), ("lws", "", "grp-0.svc", "lws/grp-0.svc"), ("local", "", "", "local/")],
)
def test_identity_key(launcher, job, head, key):
    assert ports.identity_key(launcher, job, head) == key


def test_every_chosen_port_reaches_ray_start():
    spec = NodeSpec("local", 0, 1, "127.0.0.1", port=41000, node_ip="127.0.0.1")
    chosen = ports.choose(is_head=True, nnodes=1, standing=False, key="k", gcs_port=41000, draw=counter())
    cmd = raystart.start_command(spec, Preflight(num_cpus=2), "/tmp/x", "127.0.0.1", False, chosen)
    for name, flag in ports.FLAGS.items():
        assert f"{flag}={chosen[name]}" in cmd
    assert "--port=41000" in cmd
    env = raystart.start_env({"AUTOSCALER_METRIC_PORT": "1"}, {}, Preflight(), {}, "/tmp/x", port_map=chosen)
    assert env["AUTOSCALER_METRIC_PORT"] == str(chosen["autoscaler_metrics"])
    assert env["DASHBOARD_METRIC_PORT"] == str(chosen["dashboard_metrics"])


def test_a_taken_port_is_refused_in_one_line_naming_its_holder():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert not ports.is_free(port)
        with pytest.raises(RigError) as e:
            ports.refuse_taken({"gcs": port, "dashboard": ports.kernel_free_port()})
    msg = str(e.value)
    assert "\n" not in msg and f"port {port} (Ray's GCS) is already taken" in msg
    assert f"pid {os.getpid()}" in msg and "token" not in msg


def test_no_free_port_is_said():
    with pytest.raises(RigError, match="no free port for the raylet"):
        ports.pick_free(["node_manager"], {5}, draw=lambda: 5, tries=3)


# --- whose head -------------------------------------------------------------------------------------------------

MINE = {
    "id": "a" * 16,
    "launcher": "slurm",
    "job": "12.0",
    "nnodes": 2,
    "output": "/runs/a",
    "host": "n1",
    "started": 0,
}
OTHER = {**MINE, "id": "b" * 16, "job": "11.0", "output": "/runs/b", "started": 1_700_000_000}


@pytest.mark.parametrize(
    "theirs, refused",
    [
        (None, "not an rlrig run's head"),
        (MINE, None),
        ({**MINE, "output": "/elsewhere", "started": 5}, None),  # what the head says of itself is not compared
        (OTHER, "another run's: slurm job 11.0 (2 node(s)) started"),
        ({**MINE, "nnodes": 3}, "another run's"),
        ({**MINE, "launcher": "dstack"}, "another run's"),
    ],
)
def test_a_worker_joins_only_its_own_runs_head(theirs, refused):
    store = MemoryStore()
    if theirs is not None:
        store.put(identity.RUN, theirs)
    if refused is None:
        identity.check(store, MINE, "10.0.0.1:21000", 1)
        return
    with pytest.raises(RigError) as e:
        identity.check(store, MINE, "10.0.0.1:21000", 1)
    msg = str(e.value)
    assert refused in msg and "\n" not in msg and "rank 1 of slurm job 12.0" in msg and "10.0.0.1:21000" in msg
    if theirs is OTHER:
        assert "output /runs/b" in msg


def test_a_head_never_takes_over_another_runs_store():
    store = MemoryStore()
    identity.claim(store, MINE, "a:1")
    identity.claim(store, MINE, "a:1")  # a restart in place claims it again
    with pytest.raises(RigError, match="belongs to another run: slurm job 12.0"):
        identity.claim(store, OTHER, "a:1")
    assert store.get(identity.RUN)["id"] == MINE["id"]


def test_one_jobs_nodes_agree_on_its_id_and_single_node_runs_never_do():
    key = ports.identity_key("slurm", "12.0", "n1")
    assert identity.make("slurm", "12.0", key, 2, "")["id"] == identity.make("slurm", "12.0", key, 2, "/o")["id"]
    assert identity.make("local", "", "local/", 1, "")["id"] != identity.make("local", "", "local/", 1, "")["id"]


# --- the host's runs --------------------------------------------------------------------------------------------


def test_records_are_written_private_listed_and_removed(tmp_path):
    folder = tmp_path / "runs"
    rec = runs.reserve(folder, lambda taken: {"gcs": 41000, "dashboard": 41001}, {"launcher": "local", "output": "/o"})
    assert oct(folder.stat().st_mode & 0o777) == "0o700" and oct(rec.path.stat().st_mode & 0o777) == "0o600"
    rec.phase("running")
    [got] = runs.read_all(folder)
    assert (got["pid"], got["phase"], got["ports"]["gcs"], got["output"]) == (os.getpid(), "running", 41000, "/o")
    text = runs.render([got], folder)
    assert "1 rlrig run(s) on this host" in text and "41000" in text and "/o" in text
    with runs.locked(folder) as others:
        assert runs.taken_ports(others) == {41000, 41001}
    rec.remove()
    assert runs.read_all(folder) == [] and "no rlrig run" in runs.render([], folder)


def test_a_second_run_keeps_off_the_first_runs_ports(tmp_path):
    first = runs.reserve(tmp_path, lambda taken: {"gcs": 41000}, {})
    seen = []
    runs.reserve(tmp_path, lambda taken: seen.append(set(taken)) or {"gcs": 41002}, {})
    assert seen == [{41000}]
    first.remove()


@pytest.mark.parametrize(
    "record, started, live",
    [
        ({"pid": 10, "pid_started": 100.0}, {10: 100.2}, True),
        ({"pid": 10, "pid_started": 100.0}, {}, False),  # the process is gone
        ({"pid": 10, "pid_started": 100.0}, {10: 500.0}, False),  # its pid now names another process
        ({"pid": "x"}, {}, False),
    ],
)
def test_stale_records_are_told_apart(record, started, live):
    assert runs.is_live(record, started.get) is live


def test_stale_records_are_pruned(tmp_path):
    (tmp_path / "999999.json").write_text('{"pid": 999999, "pid_started": 1.0}')
    assert runs.read_all(tmp_path, lambda pid: None) == []
    assert not (tmp_path / "999999.json").exists()


@pytest.mark.parametrize(
    "env, gpus",
    [
        ({}, "all"),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, "0,1"),
        ({"HIP_VISIBLE_DEVICES": "2"}, "2"),
        ({"CUDA_VISIBLE_DEVICES": ""}, "none"),
    ],
)
def test_a_runs_gpus_as_its_environment_names_them(env, gpus):
    assert runs.visible_gpus(env) == gpus


# --- GPUs other processes compute on ----------------------------------------------------------------------------


def nvml_process(pid, memory):
    """nvmlDeviceGetComputeRunningProcesses' items: c_nvmlProcessInfo_v3_t's fields through
    nvmlStructToFriendlyObject, usedGpuMemory None where the driver does not say."""
    fields = [name for name, _ in pynvml.c_nvmlProcessInfo_v3_t._fields_]
    assert fields == ["pid", "usedGpuMemory", "gpuInstanceId", "computeInstanceId"]
    return types.SimpleNamespace(pid=pid, usedGpuMemory=memory, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)


class NvmlError(Exception):
    pass


class FakeNvml:
    """pynvml over three GPUs: 0 idle, 1 used by two processes (one of unknown memory), 2 used by this process."""

    NVMLError = NvmlError

    def __init__(self, me: int):
        self.procs = [[], [nvml_process(4242, 3 * (1 << 30)), nvml_process(4343, None)], [nvml_process(me, 1 << 30)]]

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 3

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, i):
        return f"GPU-{i}aaa"

    def nvmlDeviceGetComputeRunningProcesses(self, i):
        return self.procs[i]


def test_the_nvml_stand_in_uses_only_names_pynvml_has():
    assert [n for n in vars(FakeNvml) if n.startswith("nvml") and not hasattr(pynvml, n)] == []


NAMES = {4242: "python", 4343: ""}


@pytest.mark.parametrize(
    "env, line",
    [
        ({}, "GPU 1 (GPU-1aaa, visible here): pid 4242 (python, 3.0 GiB), pid 4343"),
        ({"CUDA_VISIBLE_DEVICES": "0"}, "GPU 1 (GPU-1aaa, not visible here): pid 4242 (python, 3.0 GiB), pid 4343"),
        ({"CUDA_VISIBLE_DEVICES": "GPU-1"}, "GPU 1 (GPU-1aaa, visible here)"),
        ({"HIP_VISIBLE_DEVICES": "1,2"}, "GPU 1 (GPU-1aaa, visible here)"),
    ],
)
def test_doctor_warns_of_gpus_other_processes_use(monkeypatch, env, line):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", FakeNvml(os.getpid()))
    gpus, source = gpu_users.read()
    assert source == "NVML" and [g["index"] for g in gpus] == [0, 1, 2]
    pf = Preflight()
    gpu_users.check(env, pf, lambda: (gpus, source), NAMES.get)
    [c] = pf.checks
    assert c.status == "warn" and line in c.message
    assert "GPU 0" not in c.message and "GPU 2" not in c.message  # idle, and used by this process only


def test_no_gpu_no_finding_and_idle_gpus_pass():
    pf = Preflight()
    gpu_users.check({}, pf, lambda: ([], "NVML unavailable"))
    assert pf.checks == []
    gpu_users.check({}, pf, lambda: ([{"index": 0, "uuid": "GPU-0", "processes": []}], "NVML"))
    assert [(c.status, c.name) for c in pf.checks] == [("pass", "gpus in use")]


@pytest.mark.parametrize(
    "spec, port",
    [
        (NodeSpec("local", 0, 1, "127.0.0.1"), None),  # a free one, chosen at start
        (NodeSpec("local", 0, 1, "127.0.0.1", port=7000, port_given=True), 7000),
        (NodeSpec("slurm", 1, 2, "n1", job_id="12.0"), ports.derived_head_ports("slurm/12.0")["gcs"]),
        (NodeSpec("slurm", 1, 2, "n1", job_id="12.0", port=7000, port_given=True), 7000),
    ],
)
def test_doctor_shows_the_gcs_port_a_run_would_take(spec, port):
    from rlrig.entrypoint import doctor

    assert doctor.gcs_port(spec) == port
