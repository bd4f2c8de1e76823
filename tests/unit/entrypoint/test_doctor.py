"""`rlrig doctor` reports what it found even when a stage fails, and names the failed check."""

import json
import os
import socket
import subprocess
import sys

import pytest

from rlrig.entrypoint import cli, doctor
from rlrig.entrypoint.bootstrap import inspect
from rlrig.entrypoint.detect import addresses
from rlrig.entrypoint.detect.launchers import BY_NAME
from rlrig.entrypoint.preflight import inventory
from tests.helpers.entrypoint_fakes import collector

HOST = "node2"

# Launchers that name the head by host: on a login node or in a container without the cluster's
# DNS it does not resolve. (id, env, rank, nodes, head as given, the variable it came from)
UNRESOLVED = [
    (
        "slurm",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": "gpu[0-1].invalid",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        },
        1,
        2,
        "gpu0.invalid",
        "SLURM_STEP_NODELIST",
    ),
    (
        "dstack",
        {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "master.invalid"},
        1,
        2,
        "master.invalid",
        "DSTACK_MASTER_NODE_IP",
    ),
    (
        "lws",
        {"LWS_LEADER_ADDRESS": "grp-0.svc.invalid", "LWS_WORKER_INDEX": "3", "LWS_GROUP_SIZE": "4"},
        3,
        4,
        "grp-0.svc.invalid",
        "LWS_LEADER_ADDRESS",
    ),
    (
        "pytorchjob",
        {"MASTER_ADDR": "job-master-0.invalid", "RANK": "1", "WORLD_SIZE": "2"},
        1,
        2,
        "job-master-0.invalid",
        "MASTER_ADDR",
    ),
    (
        "torchrun",
        {
            "TORCHELASTIC_RUN_ID": "x",
            "GROUP_RANK": "0",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "t0.invalid",
        },
        0,
        2,
        "t0.invalid",
        "MASTER_ADDR",
    ),
    ("lsf", {"LSB_JOBID": "12", "LSB_MCPU_HOSTS": "h0.invalid 2 node2 2"}, 1, 2, "h0.invalid", "LSB_MCPU_HOSTS"),
    (
        "sagemaker",
        {"SM_CURRENT_HOST": "algo-2", "SM_HOSTS": '["algo-1.invalid","algo-2"]'},
        1,
        2,
        "algo-1.invalid",
        "SM_HOSTS",
    ),
    (
        "indexed-job",
        {"JOB_COMPLETION_INDEX": "1", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "js-0-0.sub.invalid"},
        1,
        2,
        "js-0-0.sub.invalid",
        "RLRIG_HEAD_ADDRESS",
    ),
    (
        "explicit",
        {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "3", "RLRIG_HEAD_ADDRESS": "head.invalid:7000"},
        1,
        3,
        "head.invalid",
        "RLRIG_HEAD_ADDRESS",
    ),
]


@pytest.fixture
def no_dns(monkeypatch):
    def fail(host, *args, **kw):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(addresses.socket, "getaddrinfo", fail)


@pytest.mark.parametrize("env,rank,nnodes,head,source", [r[1:] for r in UNRESOLVED], ids=[r[0] for r in UNRESOLVED])
def test_unresolvable_head_still_reports_everything_detected(no_dns, env, rank, nnodes, head, source):
    found = inspect(env, hostname=HOST, collect=collector())
    d = doctor.as_dict(found)
    assert (d["node_rank"], d["nnodes"], d["head_host"], d["head_address"], d["node_ip"]) == (
        rank,
        nnodes,
        head,
        None,
        None,
    )
    assert d["launcher"] == found.spec.launcher and d["sources"]["head_host"] == source
    assert (d["num_gpus"], d["num_cpus"]) == (2, 32)  # the machine was inspected all the same
    failed = [c for c in d["checks"] if c["status"] == "fail"]
    assert [c["name"] for c in failed] == ["head address"]
    assert f"head address '{head}' (from {source}) does not resolve" in failed[0]["message"]
    assert doctor.exit_code(found) == 1
    text = doctor.render(found, as_json=False)
    assert (
        f"node rank  {rank} of {nnodes}" in text
        and f"head       {head} -> ?:" in text
        and "[fail] head address:" in text
    )
    assert json.loads(doctor.render(found, as_json=True)) == d


NOT_DETECTED = [
    # (id, env, launcher, rank, nodes, words of the failed "launcher" check)
    ("not an integer", {"DSTACK_NODE_RANK": "one"}, "dstack", None, None, "DSTACK_NODE_RANK='one' is not an integer"),
    (
        "slurm batch script",
        {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0", "SLURM_JOB_NODELIST": "n[1-2]"},
        "slurm",
        0,
        2,
        "srun --ntasks-per-node=1",
    ),
    (
        "rank out of range",
        {"DSTACK_NODE_RANK": "3", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "10.0.0.1"},
        "dstack",
        3,
        2,
        "check DSTACK_NODE_RANK=3 and DSTACK_NODES_NUM=2",
    ),
    ("unknown RLRIG_LAUNCHER", {"RLRIG_LAUNCHER": "slrum"}, "slrum", None, None, "did you mean 'slurm'"),
]


@pytest.mark.parametrize(
    "env,launcher,rank,nnodes,words", [r[1:] for r in NOT_DETECTED], ids=[r[0] for r in NOT_DETECTED]
)
def test_failed_detection_is_a_failed_check(env, launcher, rank, nnodes, words):
    found = inspect(env, hostname=HOST, collect=collector())
    d = doctor.as_dict(found)
    assert (d["launcher"], d["node_rank"], d["nnodes"]) == (launcher, rank, nnodes)
    first = next(c for c in d["checks"] if c["status"] == "fail")
    assert first["name"] == "launcher" and words in first["message"]
    assert doctor.exit_code(found) == 1
    assert set(d) == set(doctor.as_dict(inspect({}, collect=collector())))  # the same keys as a healthy node's


def test_healthy_local_node():
    found = inspect({}, hostname=HOST, collect=collector())
    d = doctor.as_dict(found)
    assert (d["launcher"], d["node_rank"], d["nnodes"], d["head_address"], d["node_ip"]) == (
        "local",
        0,
        1,
        "127.0.0.1",
        "127.0.0.1",
    )
    assert doctor.exit_code(found) == 0 and not [c for c in d["checks"] if c["status"] == "fail"]


def test_doctor_json_through_the_cli(monkeypatch, capsys, no_dns):
    monkeypatch.setattr(os, "environ", dict(UNRESOLVED[0][1]))
    monkeypatch.setattr(inventory, "collect", collector())
    assert cli.main(["doctor", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert (d["launcher"], d["node_rank"], d["nnodes"], d["head_host"]) == ("slurm", 1, 2, "gpu0.invalid")
    assert [c["name"] for c in d["checks"] if c["status"] == "fail"][:1] == ["head address"]


def test_doctor_json_real_process_on_a_node_without_the_clusters_dns(tmp_path):
    """The issue as a user meets it: the real CLI, the real resolver, the real machine."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "RAY_TMPDIR": str(tmp_path),
        **UNRESOLVED[0][1],
    }
    r = subprocess.run(
        [sys.executable, "-m", "rlrig.entrypoint.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert (d["launcher"], d["node_rank"], d["nnodes"], d["head_host"], d["head_address"]) == (
        "slurm",
        1,
        2,
        "gpu0.invalid",
        None,
    )
    assert [c["name"] for c in d["checks"] if c["status"] == "fail"][:1] == ["head address"]
    assert isinstance(d["num_cpus"], int)


def test_run_error_names_the_launchers_variables(monkeypatch, capsys):
    monkeypatch.setattr(os, "environ", {"DSTACK_NODE_RANK": "3", "DSTACK_NODES_NUM": "2"})
    assert cli.main(["run", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert "DSTACK_NODE_RANK=3" in err and "DSTACK_NODES_NUM=2" in err and "RLRIG_" not in err


def test_launcher_choices_come_from_the_launcher_table(capsys):
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("doctor", "run", "train"):
        option = next(a for a in sub.choices[name]._actions if "--launcher" in a.option_strings)
        assert list(option.choices) == list(BY_NAME)
    with pytest.raises(SystemExit) as e:
        cli.main(["run", "--launcher", "slrum", "--", "true"])
    assert e.value.code == 2 and "invalid choice: 'slrum'" in capsys.readouterr().err


def test_the_fabric_checks_verdict_and_seconds_inside_a_command(tmp_path, monkeypatch):
    """A command rlrig runs on several nodes gets RLRIG_FABRIC_REPORT: doctor there shows the check's verdict and
    where its seconds went; elsewhere (no report, or none readable) the key is null."""
    report = tmp_path / "fabric.json"
    report.write_text(
        json.dumps(
            {"verdict": "passed", "seconds": 2.345, "phases_s": {"start": 1.2, "pairs": 0.9}, "backend": "gloo"}
            | {"median_mb_s": 900.0, "nodes": [{"rank": 0}, {"rank": 1}]}
        )
    )
    found = inspect({}, hostname=HOST, collect=collector())
    d = doctor.as_dict(found, {"RLRIG_FABRIC_REPORT": str(report)})
    assert d["fabric_check"] == {
        "verdict": "passed",
        "seconds": 2.345,
        "phases_s": {"start": 1.2, "pairs": 0.9},
        "backend": "gloo",
        "median_mb_s": 900.0,
    }
    for env in ({}, {"RLRIG_FABRIC_REPORT": str(tmp_path / "missing.json")}):
        assert doctor.as_dict(found, env)["fabric_check"] is None
    monkeypatch.setenv("RLRIG_FABRIC_REPORT", str(report))
    assert "fabric     passed in 2.3s (start 1.2s, pairs 0.9s)" in doctor.as_text(found).splitlines()
