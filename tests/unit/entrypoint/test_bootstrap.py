"""From an environment to a Plan: what each node gets, and which setting wins where several give one."""

import pytest

from rlrig.entrypoint import bootstrap
from rlrig.entrypoint.cluster import ports, raystart, runs
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.preflight import inventory
from rlrig.entrypoint.preflight.checks import Preflight
from tests.helpers.entrypoint_fakes import collector

TOKEN = "t" * 64
# a two-node dstack job seen from this machine (eth0 = 10.0.0.2): the head advertises 10.0.0.2
HEAD = {
    "DSTACK_NODE_RANK": "0",
    "DSTACK_NODES_NUM": "2",
    "DSTACK_MASTER_NODE_IP": "10.0.0.2",
    "DSTACK_NODES_IPS": "10.0.0.2\n10.0.0.3",
    "DSTACK_RUN_NAME": "r1",
    "RLRIG_CLUSTER_TOKEN": TOKEN,
}
# ... and the worker of a job whose head is 10.0.0.1
WORKER = {
    "DSTACK_NODE_RANK": "1",
    "DSTACK_NODES_NUM": "2",
    "DSTACK_MASTER_NODE_IP": "10.0.0.1",
    "DSTACK_NODES_IPS": "10.0.0.1\n10.0.0.2",
    "DSTACK_RUN_NAME": "r1",
    "RLRIG_CLUSTER_TOKEN": TOKEN,
}
GCS = ports.derived_head_ports("dstack/r1")["gcs"]  # both nodes of dstack run r1 derive the head's port alike


@pytest.fixture(autouse=True)
def made_up_machine(monkeypatch, tmp_path):
    monkeypatch.setattr(inventory, "collect", collector())
    monkeypatch.setattr(runs, "runs_dir", lambda env: tmp_path / "runs")
    monkeypatch.chdir(tmp_path)  # no ./.env unless a test writes one


def plan(env, **kw):
    return bootstrap.plan(bootstrap.PlanOptions(["true"], **kw), env=env)


def test_head_plan_holds_everything_the_node_needs():
    p = plan({**HEAD, "RLRIG_ENV_FOO": "bar"}, dashboard_host="0.0.0.0", wait_timeout=12)
    assert (p.spec.launcher, p.spec.node_rank, p.spec.node_ip, p.spec.interface) == ("dstack", 0, "10.0.0.2", "eth0")
    assert (p.token, p.token_source) == (TOKEN, "RLRIG_CLUSTER_TOKEN")
    assert p.cluster_env == {"FOO": "bar"}
    assert p.ray_env["FOO"] == "bar" and p.ray_env["RAY_AUTH_TOKEN"] == TOKEN and p.ray_env["RAY_TMPDIR"] == p.temp_dir
    assert p.temp_dir.endswith("/r1-n0")
    assert "--head" in p.start_command and "--dashboard-host=0.0.0.0" in p.start_command
    assert p.gcs_address == f"10.0.0.2:{GCS}" and p.wait_timeout == 12 and p.command == ["true"]
    assert not p.preflight.failed


def test_worker_plan_waits_for_the_heads_environment():
    p = plan({**WORKER, "RLRIG_ENV_FOO": "mine"})
    assert p.cluster_env == {}  # only the head's .env and RLRIG_ENV_* reach the cluster
    assert "FOO" not in p.ray_env
    assert f"--address=10.0.0.1:{GCS}" in p.start_command and "--head" not in p.start_command
    assert p.gcs_address == f"10.0.0.1:{GCS}"
    assert p.preflight.env_updates == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


def test_explicit_variables_win_over_the_launchers():
    p = plan({**WORKER, "RLRIG_NODE_RANK": "0", "RLRIG_HEAD_ADDRESS": "10.0.0.2:7000", "RLRIG_JOB_ID": "j"})
    assert p.spec.is_head and (p.spec.head_address, p.spec.port, p.spec.job_id) == ("10.0.0.2", 7000, "j")
    assert "--port=7000" in p.start_command


# `ray start`'s environment is layered; each row: one variable set in some layers, and who wins.
# layers: (this process's env, the cluster env from .env/RLRIG_ENV_*, preflight's own settings)
LAYERS = [
    ("health default", "RAY_health_check_period_ms", None, None, None, "1000"),
    ("user beats health default", "RAY_health_check_period_ms", "5000", None, None, "5000"),
    ("no drain on stop by default", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", None, None, None, "0"),
    ("user's drain kept", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "30", None, None, "30"),
    ("cluster beats process", "FOO", "process", "cluster", None, "cluster"),
    ("preflight beats cluster", "NCCL_SOCKET_IFNAME", "ib", "eth9", "eth0", "eth0"),
    ("token beats everything", "RAY_AUTH_TOKEN", "old", "from-dotenv", None, TOKEN),
    ("temp dir beats everything", "RAY_TMPDIR", "/elsewhere", "/also", None, "/tmp/rlrig-0/j-n0"),
    ("usage stats always off", "RAY_USAGE_STATS_ENABLED", "1", "1", None, "0"),
    ("no RAY_ADDRESS for ray start", "RAY_ADDRESS", "10.0.0.9:6379", "x", None, None),
]


@pytest.mark.parametrize("var,process,cluster,updates,expected", [r[1:] for r in LAYERS], ids=[r[0] for r in LAYERS])
def test_ray_start_environment_precedence(var, process, cluster, updates, expected):
    def layer(value):
        return {} if value is None else {var: value}

    pf = Preflight(env_updates=layer(updates))
    env = raystart.start_env(
        layer(process), layer(cluster), pf, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}, "/tmp/rlrig-0/j-n0"
    )
    assert env.get(var) == expected


def test_worker_gets_the_heads_cluster_env_under_its_own_settings():
    p = plan({**WORKER, "FOO": "process"})
    env = p.worker_ray_env(
        {"FOO": "head", "RAY_TMPDIR": "/head/tmp", "RAY_AUTH_TOKEN": "other", "NCCL_SOCKET_IFNAME": "ib0"}
    )
    assert env["FOO"] == "head"
    assert env["RAY_TMPDIR"] == p.temp_dir and env["RAY_AUTH_TOKEN"] == TOKEN
    assert env["NCCL_SOCKET_IFNAME"] == "eth0"  # the route to the head on this node, not the head's interface


def test_dotenv_and_rlrig_env_reach_the_cluster(tmp_path):
    (tmp_path / ".env").write_text("A=from-file\nB=from-file\n")
    p = plan({**HEAD, "RLRIG_ENV_B": "from-var"})
    assert p.cluster_env == {"A": "from-file", "B": "from-var"}
    other = tmp_path / "other.env"
    other.write_text("C=3\n")
    assert plan(HEAD, env_file=str(other)).cluster_env == {"C": "3"}


@pytest.mark.parametrize(
    "env,words",
    [
        ({**HEAD, "RLRIG_CLUSTER_TOKEN": ""}, "2-node cluster needs a shared token"),
        ({"DSTACK_NODE_RANK": "3", "DSTACK_NODES_NUM": "2"}, "DSTACK_NODE_RANK=3"),
        ({**WORKER, "DSTACK_MASTER_NODE_IP": "127.0.0.1"}, "loopback"),
    ],
)
def test_plan_refuses(env, words):
    with pytest.raises(RigError, match=words):
        plan(env)


def test_plan_raises_the_first_failure_and_says_the_rest(monkeypatch, capsys):
    monkeypatch.setattr(inventory, "collect", collector(nofile_soft=256, shm_bytes=1024))
    with pytest.raises(RigError) as e:
        plan({**HEAD, "CUDA_VISIBLE_DEVICES": "0,0"})
    assert str(e.value).startswith("CUDA_VISIBLE_DEVICES=0,0 lists 0 more than once")
    assert str(e.value).endswith("(and 2 more: run `rlrig doctor`)")
    said = capsys.readouterr().err
    assert "fail: /dev/shm:" in said and "fail: ulimit -n:" in said and "CUDA_VISIBLE_DEVICES" not in said


def test_single_node_generates_a_token():
    p = plan({})
    assert p.spec.launcher == "local" and p.token_source == "generated (single node)" and len(p.token) == 64


def test_existing_ray_plans_nothing_to_start():
    p = plan({"RAY_ADDRESS": "10.9.0.1:6379", "X": "1"})
    assert p.spec.existing_ray == "10.9.0.1:6379" and p.start_command == [] and p.token == ""
    assert p.base_env == {"RAY_ADDRESS": "10.9.0.1:6379", "X": "1"}


def test_inspect_keeps_going_after_a_failed_stage():
    found = bootstrap.inspect({**WORKER, "DSTACK_MASTER_NODE_IP": "127.0.0.1"}, collect=collector())
    assert [c.name for c in found.preflight.failed] == ["head address"]
    assert found.checked and found.preflight.num_gpus == 2  # the machine was still inspected


def test_plan_stops_at_a_failed_detection_before_reading_the_machine(monkeypatch):
    def must_not_run(temp_dir, env):
        raise AssertionError("the machine was inspected after detection failed")

    monkeypatch.setattr(inventory, "collect", must_not_run)
    with pytest.raises(RigError, match="DSTACK_NODES_NUM=2"):
        plan({"DSTACK_NODE_RANK": "3", "DSTACK_NODES_NUM": "2"})


@pytest.mark.parametrize(
    "env,given,expected",
    [({}, None, 300.0), ({"RLRIG_WAIT_TIMEOUT": "45"}, None, 45.0), ({"RLRIG_WAIT_TIMEOUT": "45"}, 10.0, 10.0)],
)
def test_wait_timeout_from_option_then_variable(env, given, expected):
    assert plan(env, wait_timeout=given).wait_timeout == expected


def test_wait_timeout_not_a_number():
    with pytest.raises(RigError, match="RLRIG_WAIT_TIMEOUT='soon' is not a number"):
        plan({"RLRIG_WAIT_TIMEOUT": "soon"})


def test_a_standing_head_sends_its_debug_mode_to_every_node():
    p = plan({**HEAD, "RLRIG_ENV_VLLM_ATTENTION_BACKEND": "XFORMERS"}, standing=True, debug="legacy")
    assert p.standing and p.cluster_env == {"VLLM_ATTENTION_BACKEND": "XFORMERS", "RAY_DEBUG": "legacy"}
    assert "--ray-debugger-external" in p.start_command
    w = plan(WORKER, standing=True)  # a worker started without --debug still gets the head's
    env = w.worker_ray_env(p.cluster_env)
    assert env["RAY_DEBUG"] == "legacy" and "--ray-debugger-external" in w.worker_start_command(env)
    assert "--ray-debugger-external" not in w.worker_start_command(w.worker_ray_env({}))


@pytest.mark.parametrize(
    "env,kw,words",
    [
        ({**HEAD, "RAY_DEBUG": "legacy"}, {"debug": "post-mortem"}, "unset RAY_DEBUG"),
        ({"RLRIG_CLUSTER_TOKEN": "", "RAY_DEBUG_POST_MORTEM": ""}, {"standing": True}, "rlrig up needs a token"),
        ({"RAY_ADDRESS": "10.9.0.1:6379"}, {"standing": True}, "nothing to bring up"),
    ],
)
def test_standing_plan_refuses(env, kw, words):
    with pytest.raises(RigError, match=words):
        plan(env, **kw)


def test_metrics_on_the_node_ip_only_when_asked():
    assert plan(HEAD).ray_env["RLRIG_METRICS_HOST"] == "127.0.0.1"
    assert plan(HEAD, metrics_on_node_ip=True).ray_env["RLRIG_METRICS_HOST"] == "10.0.0.2"
    labels = next(a for a in plan(HEAD).start_command if a.startswith("--labels="))
    assert '"rlrig.io/nnodes": "2"' in labels and '"rlrig.io/node-rank": "0"' in labels
