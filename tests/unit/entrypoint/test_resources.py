"""RLRIG_RESOURCES and the automatic node labels: parsed, refused in one line, passed to `ray start`, shown."""

import json
import os
import sys

import pytest

from rlrig.entrypoint import bootstrap, cli, doctor, lifecycle
from rlrig.entrypoint.cluster.coordination import GPU_MODEL_LABEL, HOST_LABEL, LAUNCHER_LABEL, NNODES_LABEL, RANK_LABEL
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.preflight import inventory, resources
from rlrig.entrypoint.preflight.checks import Preflight
from tests.helpers.entrypoint_fakes import MemoryStore, collector

VAR = resources.VAR
TOKEN = "t" * 64
HEAD = {
    "DSTACK_NODE_RANK": "0",
    "DSTACK_NODES_NUM": "2",
    "DSTACK_MASTER_NODE_IP": "10.0.0.2",
    "DSTACK_NODES_IPS": "10.0.0.2\n10.0.0.3",
    "DSTACK_RUN_NAME": "r1",
    "RLRIG_CLUSTER_TOKEN": TOKEN,
}
WORKER = {
    **HEAD,
    "DSTACK_NODE_RANK": "1",
    "DSTACK_MASTER_NODE_IP": "10.0.0.1",
    "DSTACK_NODES_IPS": "10.0.0.1\n10.0.0.2",
}


@pytest.fixture(autouse=True)
def made_up_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(inventory, "collect", collector())
    monkeypatch.chdir(tmp_path)  # no ./.env unless a test writes one


def plan(env, **kw):
    return bootstrap.plan(bootstrap.PlanOptions(["true"], **kw), env=env)


def flag(cmd: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in cmd if a.startswith(f"--{name}=")), None)


GOOD = [
    # (id, value, resources)
    ("the FAQ's small machine", '{"v100": 1}', {"v100": 1}),
    ("several, fractional", '{"h100": 1, "nvme": 0.5}', {"h100": 1, "nvme": 0.5}),
    ("zero is an amount", '{"spare": 0}', {"spare": 0}),
    ("spaces around", '  {"a": 2}\n', {"a": 2}),
    ("empty object", "{}", {}),
    ("a name Ray does not reserve", '{"cpu_big": 4, "node_pool": 1}', {"cpu_big": 4, "node_pool": 1}),
]


@pytest.mark.parametrize("raw,expected", [r[1:] for r in GOOD], ids=[r[0] for r in GOOD])
def test_good_values(raw, expected):
    assert resources.parse(raw) == expected


BAD = [
    # (id, value, words of the message after "RLRIG_RESOURCES=<value>")
    ("unquoted name", "{v100: 1}", "is not JSON (Expecting property name enclosed in double quotes at column 2)"),
    ("a bare word", "v100", "is not JSON"),
    ("shell ate the quotes", "{v100:1}", "is not JSON"),
    ("an array", '[{"v100": 1}]', "is an array, not a JSON object"),
    ("a string", '"v100"', "is a string, not a JSON object"),
    ("a number", "1", "is a number, not a JSON object"),
    ("null", "null", "is null, not a JSON object"),
    ("amount as a string", '{"v100": "1"}', 'v100 is "1", not a non-negative number'),
    ("negative", '{"v100": -1}', "v100 is -1, not a non-negative number"),
    ("boolean", '{"v100": true}', "v100 is true, not a non-negative number"),
    ("NaN", '{"v100": NaN}', "v100 is NaN, not a non-negative number"),
    ("Infinity", '{"v100": Infinity}', "v100 is Infinity, not a non-negative number"),
    ("null amount", '{"v100": null}', "v100 is null, not a non-negative number"),
    ("nested", '{"v100": {"n": 1}}', 'v100 is {"n": 1}, not a non-negative number'),
    ("empty name", '{"": 1}', "a resource without a name"),
    ("CPU", '{"CPU": 4}', "CPU is reserved by Ray: rlrig sets it with --num-cpus from RLRIG_NUM_CPUS"),
    ("GPU", '{"v100": 1, "GPU": 2}', "GPU is reserved by Ray: rlrig sets it with --num-gpus from the visible GPUs"),
    ("memory", '{"memory": 1e9}', "memory is reserved by Ray: Ray sizes it from this node's memory"),
    (
        "object store",
        '{"object_store_memory": 1e9}',
        "object_store_memory is reserved by Ray: rlrig sets it with --object-store-memory",
    ),
    ("node id", '{"node:10.0.0.1": 1}', "node:10.0.0.1 is reserved by Ray: Ray names every node node:<ip> itself"),
    ("head marker", '{"node:__internal_head__": 1}', "node:__internal_head__ is reserved by Ray"),
    ("accelerator type", '{"accelerator_type:H100": 1}', "accelerator_type:H100 is reserved by Ray"),
]


@pytest.mark.parametrize("raw,words", [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_bad_values_fail_in_one_line_naming_the_variable(raw, words):
    with pytest.raises(RigError) as e:
        resources.parse(raw)
    msg = str(e.value)
    assert msg.startswith(f"{VAR}={raw!r}") and words in msg, msg
    assert "\n" not in msg and e.value.exit_code == 2
    assert "e.g." in msg or f"remove it from {VAR}" in msg  # and says how to fix it


def test_a_value_from_a_file_says_which_file(tmp_path):
    with pytest.raises(RigError, match=rf"^{VAR}='\[1\]' \(in /x/.env\) is an array"):
        resources.parse("[1]", "/x/.env")


LOOKUP = [
    # (id, process env, .env text or None, value, source)
    ("unset", {}, None, None, ""),
    ("environment", {VAR: '{"a": 1}'}, None, '{"a": 1}', "environment"),
    (".env", {}, f"{VAR}='{{\"b\": 1}}'\n", '{"b": 1}', "FILE"),
    ("environment beats .env", {VAR: '{"a": 1}'}, f"{VAR}='{{\"b\": 1}}'\n", '{"a": 1}', "environment"),
    ("empty in the environment is unset", {VAR: " "}, f"{VAR}='{{\"b\": 1}}'\n", '{"b": 1}', "FILE"),
    ("empty everywhere", {VAR: ""}, f"{VAR}=\n", None, ""),
    ("key without value", {}, f"{VAR}\n", None, ""),
]


@pytest.mark.parametrize("env,text,value,source", [r[1:] for r in LOOKUP], ids=[r[0] for r in LOOKUP])
def test_lookup_environment_then_env_file(tmp_path, env, text, value, source):
    path = None
    if text is not None:
        path = tmp_path / "node.env"
        path.write_text(text)
    assert resources.lookup(env, str(path) if path else None) == (value, str(path) if source == "FILE" else source)


def test_check_records_a_pass_or_a_fail_and_nothing_when_unset(tmp_path):
    pf = Preflight()
    resources.check({}, None, pf)
    assert pf.checks == [] and pf.custom_resources == {}
    resources.check({VAR: '{"v100": 1}'}, None, pf)
    assert pf.custom_resources == {"v100": 1} and (pf.checks[-1].status, pf.checks[-1].message) == (
        "pass",
        "v100 1 (from environment)",
    )
    resources.check({}, str(tmp_path / "absent.env"), pf)
    assert (pf.checks[-1].name, pf.checks[-1].status) == (VAR, "fail") and "does not exist" in pf.checks[-1].message


def test_start_command_carries_the_resources_on_head_and_worker():
    head = plan({**HEAD, VAR: '{"h100": 1}'})
    assert json.loads(flag(head.start_command, "resources")) == {"h100": 1}
    worker = plan({**WORKER, VAR: '{"v100": 1}'})
    assert json.loads(flag(worker.worker_start_command(worker.worker_ray_env({})), "resources")) == {"v100": 1}
    assert flag(plan(HEAD).start_command, "resources") is None  # nothing set: no flag at all


def test_each_node_reads_its_own_env_file_and_the_heads_stays_on_the_head(tmp_path):
    (tmp_path / ".env").write_text(f"{VAR}='{{\"h100\": 1}}'\nA=1\n")
    head = plan(HEAD)
    assert json.loads(flag(head.start_command, "resources")) == {"h100": 1}
    assert head.cluster_env == {"A": "1"}  # the head's resources are not sent to the workers as theirs
    other = tmp_path / "small.env"
    other.write_text(f"{VAR}='{{\"v100\": 1}}'\n")
    worker = plan(WORKER, env_file=str(other))
    assert json.loads(flag(worker.worker_start_command(worker.worker_ray_env(head.cluster_env)), "resources")) == {
        "v100": 1
    }


def test_a_bad_value_stops_the_plan_before_the_machine_is_read(monkeypatch):
    def must_not_run(temp_dir, env):
        raise AssertionError("the machine was inspected with a bad RLRIG_RESOURCES")

    monkeypatch.setattr(inventory, "collect", must_not_run)
    with pytest.raises(RigError, match=rf"^{VAR}='\{{\"GPU\": 2\}}': GPU is reserved by Ray"):
        plan({**HEAD, VAR: '{"GPU": 2}'})


def test_a_bad_value_through_the_cli_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(os, "environ", {VAR: "{v100: 1}"})
    assert cli.main(["run", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"rlrig: error: {VAR}='{{v100: 1}}' is not JSON") and err.count("\n") == 1


LABELS = [
    # (id, env, machine, gpu-model label)
    ("the node's GPUs", {}, {}, "NVIDIA-H100-80GB-HBM3"),
    ("no GPU", {}, {"n_gpus": 0}, "none"),
    ("visible devices hidden", {"CUDA_VISIBLE_DEVICES": ""}, {}, "none"),
    (
        "the visible one's model",
        {"CUDA_VISIBLE_DEVICES": "1"},
        {"models": ("NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB")},
        "Tesla-V100-SXM2-16GB",
    ),
    ("by UUID", {"CUDA_VISIBLE_DEVICES": "GPU-aaaaaaaa"}, {"models": ("A10", "L4")}, "L4"),
    ("two models, each named", {}, {"models": ("NVIDIA A10", "NVIDIA L4")}, "NVIDIA-A10_NVIDIA-L4"),
    ("the driver would not say", {}, {"models": ("",)}, "unknown"),
]


@pytest.mark.parametrize("env,machine,model", [r[1:] for r in LABELS], ids=[r[0] for r in LABELS])
def test_automatic_labels(monkeypatch, env, machine, model):
    monkeypatch.setattr(inventory, "collect", collector(**machine))
    labels = json.loads(flag(plan({**HEAD, **env}).start_command, "labels"))
    assert labels[GPU_MODEL_LABEL] == model and labels[LAUNCHER_LABEL] == "dstack"
    assert (labels[RANK_LABEL], labels[NNODES_LABEL]) == ("0", "2") and labels[HOST_LABEL]


def test_labels_pass_rays_own_checks(monkeypatch):
    from ray._private.label_utils import validate_node_label_syntax, validate_node_labels

    monkeypatch.setattr(inventory, "collect", collector(models=("AMD Instinct MI300X (gfx942:sramecc+:xnack-)",)))
    labels = json.loads(flag(plan(HEAD).start_command, "labels"))
    validate_node_labels(labels)
    validate_node_label_syntax(labels)
    assert labels[GPU_MODEL_LABEL] == "AMD-Instinct-MI300X--gfx942-sramecc--xnack"


def test_doctor_shows_resources_and_labels(tmp_path):
    (tmp_path / ".env").write_text(f"{VAR}='{{\"v100\": 1}}'\n")
    found = bootstrap.inspect({}, collect=collector())
    d = doctor.as_dict(found)
    assert d["resources"] == {"CPU": 32, "GPU": 2, "v100": 1}
    assert (d["labels"][GPU_MODEL_LABEL], d["labels"][LAUNCHER_LABEL], d["labels"][RANK_LABEL]) == (
        "NVIDIA-H100-80GB-HBM3",
        "local",
        "0",
    )
    assert [c["message"] for c in d["checks"] if c["name"] == VAR] == [f"v100 1 (from {tmp_path / '.env'})"]
    text = doctor.render(found, as_json=False)
    assert "resources  CPU 32, GPU 2, v100 1" in text
    assert f"{GPU_MODEL_LABEL}=NVIDIA-H100-80GB-HBM3" in text and f"{LAUNCHER_LABEL}=local" in text
    assert json.loads(doctor.render(found, as_json=True)) == d


def test_doctor_names_a_bad_value_and_still_shows_the_rest():
    found = bootstrap.inspect({VAR: '{"CPU": 4}'}, collect=collector())
    d = doctor.as_dict(found)
    assert [c["name"] for c in d["checks"] if c["status"] == "fail"] == [VAR]
    assert d["resources"] == {"CPU": 32, "GPU": 2} and d["labels"][GPU_MODEL_LABEL] == "NVIDIA-H100-80GB-HBM3"
    assert doctor.exit_code(found) == 1


def test_doctor_without_a_detected_node_has_null_resources():
    found = bootstrap.inspect({"DSTACK_NODE_RANK": "one"}, collect=collector())
    assert (doctor.as_dict(found)["resources"], doctor.as_dict(found)["labels"]) == (None, None)
    assert "resources  ?" in doctor.as_text(found) and "labels     ?" in doctor.as_text(found)


SUMMARY = [
    # (id, resources, text)
    ("CPU and GPU first", {"v100": 1, "GPU": 2.0, "CPU": 8.0}, "CPU 8, GPU 2, v100 1"),
    (
        "Ray's own node names and byte counts left out",
        {
            "CPU": 16.0,
            "node:10.0.0.2": 1.0,
            "node:__internal_head__": 1.0,
            "memory": 8.1e10,
            "object_store_memory": 2e10,
            "accelerator_type:H100": 1.0,
            "h100": 1.0,
        },
        "CPU 16, accelerator_type:H100 1, h100 1",
    ),
    ("fractions kept", {"CPU": 2.0, "nvme": 0.5}, "CPU 2, nvme 0.5"),
    ("nothing", {}, ""),
]


@pytest.mark.parametrize("given,text", [r[1:] for r in SUMMARY], ids=[r[0] for r in SUMMARY])
def test_summary(given, text):
    assert resources.summary(given) == text


def test_head_log_has_one_line_per_node_from_rays_node_table():
    store = MemoryStore()
    store.join(1, "10.0.0.2", "small", {"CPU": 8.0, "GPU": 1.0, "v100": 1.0, "node:10.0.0.2": 1.0})
    store.join(0, "10.0.0.1", "big", {"CPU": 32.0, "GPU": 8.0, "h100": 1.0})
    store.join(2, "10.0.0.3", "cpuonly", {"CPU": 4.0})  # Ray leaves GPU out of a node without any
    store.join(3, "10.0.0.4")  # a record without host or resources still gets its line
    assert lifecycle.node_lines(store.nodes()) == [
        "node rank 0 (big, 10.0.0.1): CPU 32, GPU 8, h100 1",
        "node rank 1 (small, 10.0.0.2): CPU 8, GPU 1, v100 1",
        "node rank 2 (cpuonly, 10.0.0.3): CPU 4, GPU 0",
        "node rank 3 (10.0.0.4): GPU 0",
    ]


class FakeNvml:
    """pynvml as older releases answer (bytes) for GPU 0 and newer ones (str) for GPU 1; GPU 0 (a V100) has no MIG,
    GPU 1 is in MIG mode with instances in slots 0 and 2 of 3."""

    NVML_DEVICE_MIG_ENABLE = 1

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    class NVMLError_NotFound(NVMLError):
        pass

    def nvmlDeviceGetMigMode(self, h):
        if h == 0:
            raise self.NVMLError_NotSupported()
        return 1, 1

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 3

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, slot):
        if slot == 1:
            raise self.NVMLError_NotFound()
        return f"mig{slot}"

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUUID(self, h):
        return f"MIG-{h}" if isinstance(h, str) else [b"GPU-0", "GPU-1"][h]

    def nvmlDeviceGetName(self, h):
        return [b"Tesla V100-SXM2-16GB", "NVIDIA H100 80GB HBM3"][h]

    def nvmlSystemGetDriverVersion(self):
        return b"580.95.05"


def test_nvml_probe_reads_each_gpus_model(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml())
    gpus, probe, driver = inventory.probe_nvidia()
    assert (
        probe == "NVML"
        and driver == "580.95.05"
        and [(g.uuid, g.model) for g in gpus] == [("GPU-0", "Tesla V100-SXM2-16GB"), ("GPU-1", "NVIDIA H100 80GB HBM3")]
    )
    assert [(g.mig, g.mig_devices) for g in gpus] == [(False, []), (True, ["MIG-mig0", "MIG-mig2"])]
