"""Every preflight branch on a made-up machine: inventory in, checks out."""

from pathlib import Path

import pytest

from rlrig.entrypoint.detect.addresses import Interface
from rlrig.entrypoint.detect.nodespec import NodeSpec
from rlrig.entrypoint.preflight import checks as preflight
from rlrig.entrypoint.preflight.inventory import in_container, infiniband_devices
from tests.helpers.entrypoint_fakes import UUIDS, GiB, machine


def spec(**kw) -> NodeSpec:
    base = dict(
        launcher="dstack",
        node_rank=1,
        nnodes=2,
        head_host="10.0.0.1",
        head_address="10.0.0.1",
        node_ip="10.0.0.2",
        interface="eth0",
    )
    base.update(kw)
    return NodeSpec(**base)


def run(env=None, inv=None, sp=None):
    return preflight.run(sp or spec(), env or {}, inv or machine())


def status(pf, name):
    return [c for c in pf.checks if c.name == name][-1]


FAILS = [
    # (id, env, inventory changes, spec changes, failing check, words in its message)
    ("duplicate ids", {"CUDA_VISIBLE_DEVICES": "0,1,0,1"}, {}, {}, "CUDA_VISIBLE_DEVICES", "more than once"),
    (
        "not an id",
        {"CUDA_VISIBLE_DEVICES": "0,gpu1"},
        {},
        {},
        "CUDA_VISIBLE_DEVICES",
        "neither a GPU index nor a GPU UUID",
    ),
    ("index beyond", {"CUDA_VISIBLE_DEVICES": "0,4"}, {}, {}, "CUDA_VISIBLE_DEVICES", "index 4 but this node has 2"),
    (
        "unknown uuid",
        {"CUDA_VISIBLE_DEVICES": "GPU-99999999-2222-3333-4444-555555555555"},
        {},
        {},
        "CUDA_VISIBLE_DEVICES",
        "not a GPU or MIG device on this node",
    ),
    ("hip duplicate", {"HIP_VISIBLE_DEVICES": "1,1"}, {}, {}, "HIP_VISIBLE_DEVICES", "more than once"),
    (
        "hip vs cuda",
        {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "1"},
        {},
        {},
        "HIP_VISIBLE_DEVICES",
        "disagrees",
    ),
    (
        "rocr with hip",
        {"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"},
        {},
        {},
        "ROCR_VISIBLE_DEVICES",
        "unset ROCR_VISIBLE_DEVICES",
    ),
    ("fewer than allotted", {"CUDA_VISIBLE_DEVICES": "0"}, {}, {"gpus_allotted": 2}, "gpus", "allotted 2 GPU(s)"),
    ("no gpus but allotted", {}, {"gpus": []}, {"gpus_allotted": 8}, "gpus", "--gpus all"),
    ("nccl no match", {"NCCL_SOCKET_IFNAME": "ens"}, {}, {}, "NCCL_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME=eth0"),
    (
        "nccl excludes all",
        {"NCCL_SOCKET_IFNAME": "^eth,ib,docker"},
        {},
        {},
        "NCCL_SOCKET_IFNAME",
        "matches no interface",
    ),
    ("nccl exact miss", {"NCCL_SOCKET_IFNAME": "=eth"}, {}, {}, "NCCL_SOCKET_IFNAME", "matches no interface"),
    ("gloo caret", {"GLOO_SOCKET_IFNAME": "^docker0"}, {}, {}, "GLOO_SOCKET_IFNAME", "no '^' exclusion"),
    ("gloo prefix", {"GLOO_SOCKET_IFNAME": "eth"}, {}, {}, "GLOO_SOCKET_IFNAME", "no interface named eth"),
    ("ib hca no devices", {"NCCL_IB_HCA": "mlx5_0"}, {}, {}, "NCCL_IB_HCA", "NCCL_IB_DISABLE=1"),
    ("shm tiny", {}, {"shm_bytes": 64 * 1024**2}, {}, "/dev/shm", "--shm-size"),
    ("nofile tiny", {}, {"nofile_soft": 256}, {}, "ulimit -n", "ulimit -n 65536"),
    ("temp full", {}, {"temp_free_bytes": 100 * 1024**2}, {}, "temp dir", "RAY_TMPDIR"),
]


@pytest.mark.parametrize("env,inv,sp,name,words", [r[1:] for r in FAILS], ids=[r[0] for r in FAILS])
def test_failures(env, inv, sp, name, words):
    pf = run(env, machine(**inv), spec(**sp))
    check = status(pf, name)
    assert check.status == "fail", pf.checks
    assert words in check.message
    assert name.split()[0].lstrip("/") in check.message or name in ("gpus", "temp dir")


@pytest.mark.parametrize(
    "hca,expect", [("mlx5_1:1", "fail"), ("mlx5", "pass"), ("=mlx5_0:1", "pass"), ("^mlx5_1", "pass")]
)
def test_ib_hca_against_devices(hca, expect):
    pf = run({"NCCL_IB_HCA": hca}, machine(ib_devices=["mlx5_0"]))
    assert status(pf, "NCCL_IB_HCA").status == expect


def test_infiniband_devices_read_from_sysfs(tmp_path: Path):
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert infiniband_devices(tmp_path) == ["mlx5_0", "mlx5_1"]
    assert infiniband_devices(tmp_path / "absent") == []


@pytest.mark.parametrize(
    "files,env,expect",
    [
        ([".dockerenv"], {}, True),
        ([".containerenv"], {}, True),
        ([], {"APPTAINER_CONTAINER": "/img.sif"}, True),
        ([], {}, False),
    ],
)
def test_in_container_is_an_inventory_fact(tmp_path: Path, files, env, expect):
    for name in files:
        (tmp_path / name).touch()
    paths = (str(tmp_path / ".dockerenv"), str(tmp_path / ".containerenv"))
    assert in_container(env, paths) is expect


WARNS = [
    ("more than allotted", {}, {}, {"gpus_allotted": 1}, "gpus"),
    ("nccl other iface", {"NCCL_SOCKET_IFNAME": "ib"}, {}, {}, "NCCL_SOCKET_IFNAME"),
    ("shm small", {}, {"shm_bytes": 2 * GiB}, {}, "/dev/shm"),
    ("nofile low", {}, {"nofile_soft": 4096}, {}, "ulimit -n"),
    ("temp low", {}, {"temp_free_bytes": 5 * GiB}, {}, "temp dir"),
]


@pytest.mark.parametrize("env,inv,sp,name", [r[1:] for r in WARNS], ids=[r[0] for r in WARNS])
def test_warnings_do_not_fail(env, inv, sp, name):
    pf = run(env, machine(**inv), spec(**sp))
    assert status(pf, name).status == "warn"
    assert not pf.failed


def test_good_node_passes_and_sets_socket_ifnames():
    pf = run({"CUDA_VISIBLE_DEVICES": "1,0"})
    assert not pf.failed
    assert pf.num_gpus == 2
    assert pf.env_updates == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


def test_uuids_and_exclusions_pass():
    pf = run({"CUDA_VISIBLE_DEVICES": UUIDS[1], "NCCL_SOCKET_IFNAME": "^docker,lo", "GLOO_SOCKET_IFNAME": "eth0"})
    assert not pf.failed and pf.num_gpus == 1
    assert "NCCL_SOCKET_IFNAME" not in pf.env_updates


def test_single_node_sets_nothing():
    pf = run({}, sp=spec(nnodes=1, node_rank=0, head_address="127.0.0.1", node_ip="127.0.0.1", interface="lo"))
    assert pf.env_updates == {}


def test_cpu_count_follows_allocation():
    assert run(sp=spec(cpus_allotted=8)).num_cpus == 8
    assert run(inv=machine(cpu_count=4)).num_cpus == 4


def test_object_store_capped_by_shm():
    pf = run(inv=machine(shm_bytes=2 * GiB))
    assert pf.object_store_bytes == int(2 * GiB * 0.8)


@pytest.mark.parametrize(
    "node_ip,head,container,expect",
    [
        ("172.17.0.3", "10.0.0.1", True, "fail"),  # docker0 bridge, head elsewhere
        ("172.18.0.3", "172.18.0.2", True, "pass"),  # compose network: head on the same bridge
        ("172.17.0.3", "10.0.0.1", False, "pass"),  # bare metal with a 172.17 address
        ("10.0.0.2", "10.0.0.1", True, "pass"),  # host networking
    ],
)
def test_bridge_address(node_ip, head, container, expect):
    inv = machine(interfaces=[Interface("eth0", [(node_ip, 16)])], in_container=container)
    pf = run({}, inv, spec(node_ip=node_ip, head_address=head))
    assert status(pf, "node_ip").status == expect
    if expect == "fail":
        assert "--network host" in status(pf, "node_ip").message


def test_temp_dir_too_long_for_sockets():
    pf = preflight.run(spec(), {}, machine(), temp_dir="/tmp/" + "x" * 60)
    assert status(pf, "temp dir path").status == "fail"
    assert "RAY_TMPDIR" in status(pf, "temp dir path").message


# --- MIG and ROCR -----------------------------------------------------------------------------------------------

MIGS = ["MIG-0f0f0f0f-1111-2222-3333-444444444444", "MIG-5a5a5a5a-6666-7777-8888-999999999999"]


def mig_machine(devices=tuple(MIGS)):
    """GPU 0 in MIG mode with `devices` made on it, GPU 1 a whole GPU."""
    inv = machine()
    inv.gpus[0].mig, inv.gpus[0].mig_devices = True, list(devices)
    return inv


@pytest.mark.parametrize(
    "visible, devices, ok, gpus, words",
    [
        (",".join(MIGS), MIGS, True, 2, "2 MIG device(s), one per worker"),
        (MIGS[1][:12], MIGS, True, 1, "1 MIG device(s)"),  # a unique prefix, as for GPU UUIDs
        (f"MIG-{UUIDS[0]}/1/0", MIGS, True, 1, "1 MIG device(s)"),  # the form drivers before R470 use
        ("1", MIGS, True, 1, "CUDA_VISIBLE_DEVICES=1"),  # the whole GPU beside the MIG one
        ("0", MIGS[:1], True, 1, "CUDA_VISIBLE_DEVICES=0"),  # one MIG device: a process sees exactly it
        (None, MIGS, False, 0, "GPU 0 (GPU-11111111-2222-3333-4444-555555555555) is in MIG mode with 2 MIG device(s)"),
        ("0,1", MIGS, False, 0, f"CUDA_VISIBLE_DEVICES={MIGS[0]},{MIGS[1]}"),
        ("0", [], False, 0, "nvidia-smi mig -cgi"),
        (f"{MIGS[0]},1", MIGS, False, 0, "mixes MIG devices and whole GPUs"),
        ("MIG-77777777-0000-0000-0000-000000000000", MIGS, False, 0, "not a GPU or MIG device on this node"),
    ],
)
def test_mig_devices_by_uuid(visible, devices, ok, gpus, words):
    pf = run({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}, mig_machine(devices))
    assert bool(pf.failed) is not ok, pf.checks
    assert any(words in c.message for c in pf.checks), pf.checks
    if ok:
        assert pf.num_gpus == gpus and pf.gpu_model == "NVIDIA H100 80GB HBM3"
        assert pf.mig_devices == (gpus if visible.startswith("MIG-") else 0)


@pytest.mark.parametrize("vendor, gpus, fails", [("amd", 2, True), (None, 0, True), ("nvidia", 2, False)])
def test_rocr_visible_devices_alone(vendor, gpus, fails):
    inv = machine(n_gpus=gpus)
    for g in inv.gpus:
        g.vendor = vendor
    pf = run({"ROCR_VISIBLE_DEVICES": "0"}, inv)
    rocr = [c for c in pf.checks if c.name == "ROCR_VISIBLE_DEVICES" and c.status == "fail"]
    assert bool(rocr) is fails, pf.checks
    if fails:
        assert "set HIP_VISIBLE_DEVICES=0 and unset ROCR_VISIBLE_DEVICES" in rocr[0].message


@pytest.mark.parametrize(
    "migs, per_node, device, fails",
    [
        (2, 2, "cuda", True),
        (2, 2, "auto", True),
        (2, 1, "cuda", False),
        (1, 1, "cuda", False),
        (0, 8, "cuda", False),
        (2, 2, "cpu", False),
    ],
)
def test_training_workers_on_several_mig_devices_are_refused(migs, per_node, device, fails):
    from rlrig.entrypoint.errors import RigError
    from rlrig.entrypoint.trainerfit import check_mig

    if fails:
        with pytest.raises(RigError, match="NCCL does not run between MIG devices; use trainer.n_gpus_per_node=1"):
            check_mig(migs, per_node, device)
    else:
        check_mig(migs, per_node, device)


DRIVERS = [
    # (id, driver, torch's CUDA, status or None for no check, words)
    ("cuda 13 on r580", "580.65.06", "13.0", "pass", "needs 580.65.06+"),
    ("cuda 13 on r575", "575.57.08", "13.0", "fail", "install a torch built for CUDA 12"),
    ("cuda 13 on r470", "470.256.02", "13.0", "fail", "update the host's driver"),
    ("cuda 12.9 on r550", "550.163.01", "12.9", "pass", "CUDA 12.9"),
    (
        "cuda 12 on r515",
        "515.105.01",
        "12.1",
        "fail",
        "(525.60.13 or newer): update the host's driver, or install a torch built for CUDA 11",
    ),
    ("cuda 14", "600.10", "14.0", "warn", "no driver minimum"),
    ("cpu torch", "580.65.06", "", None, ""),
    ("no nvidia driver", "", "13.0", None, ""),
]


@pytest.mark.parametrize("driver,cuda,expect,words", [r[1:] for r in DRIVERS], ids=[r[0] for r in DRIVERS])
def test_driver_against_torchs_cuda_build(driver, cuda, expect, words):
    pf = run(inv=machine(nvidia_driver=driver, torch_cuda=cuda))
    checks = [c for c in pf.checks if c.name == "NVIDIA driver"]
    if expect is None:
        assert checks == []
        return
    assert checks[0].status == expect and words in checks[0].message and "\n" not in checks[0].message, checks
    if expect == "fail":
        assert f"driver {driver} is older" in checks[0].message
        assert ("install a torch" in checks[0].message) == ("install a torch" in words)


@pytest.mark.parametrize(
    "text,expect",
    [
        ("cuda: Optional[str] = '13.0'\n", "13.0"),
        ("cuda = '12.9'\n", "12.9"),
        ("cuda: Optional[str] = None\nhip: Optional[str] = '6.4'\n", ""),
    ],
)
def test_torch_cuda_build_is_read_without_importing_torch(tmp_path, monkeypatch, text, expect):
    import importlib.util

    from rlrig.entrypoint.preflight import inventory

    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "version.py").write_text(text)
    spec = importlib.util.spec_from_file_location(
        "torch", tmp_path / "torch" / "__init__.py", submodule_search_locations=[str(tmp_path / "torch")]
    )
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec)
    assert inventory.torch_cuda_build() == expect
