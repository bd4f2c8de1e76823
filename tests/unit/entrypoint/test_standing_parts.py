"""The standing cluster's pure parts: node changes, job results, addresses, runtime envs, status, tokens,
debug modes, the metrics binding, the trainer's node-count check."""

import json
import subprocess
import sys
import textwrap

import pytest

from rlrig.entrypoint import bootstrap, trainerfit
from rlrig.entrypoint.cluster import auth, coordination, debugmode, metricsbind, prestart, raystart
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.jobs import status, submit
from rlrig.entrypoint.jobs.api import Job
from rlrig.entrypoint.jobs.standing import LOST_PREFIX


def alive(*ranks, dead=()):
    return {
        **{r: {"alive": True, "ip": f"10.0.0.{r + 1}"} for r in ranks},
        **{r: {"alive": False, "ip": f"10.0.0.{r + 1}"} for r in dead},
    }


@pytest.mark.parametrize(
    "before,now,lost,back",
    [
        ({0: True, 1: True}, alive(0, 1), [], []),
        ({0: True, 1: True}, alive(0, dead=[1]), [1], []),
        ({0: True, 1: False}, alive(0, dead=[1]), [], []),  # said once, not on every look
        ({0: True, 1: False}, alive(0, 1), [], [1]),
        ({0: True, 1: True}, alive(0), [1], []),  # gone from the table altogether
        ({0: True}, alive(0, 1), [], []),  # a node joining late is not "back"
    ],
)
def test_node_changes(before, now, lost, back):
    assert coordination.node_changes(before, now) == (lost, back)


def test_a_node_is_named_by_rank_host_and_ip():
    known = {1: {"hostname": "gpu7", "ip": "10.0.0.2"}}
    assert coordination.describe(1, known) == "rank 1 (gpu7, 10.0.0.2)"
    assert coordination.describe(2, known, "10.0.0.3") == "rank 2 (10.0.0.3)"
    assert coordination.describe(3, {}) == "rank 3"


def job(status, message="", code=None):
    return Job("j", status, "python x.py", 0, message, code)


@pytest.mark.parametrize(
    "j,code",
    [
        (job("SUCCEEDED"), 0),
        (job("FAILED", "Job entrypoint command failed with exit code 7", 7), 7),
        (job("FAILED", "runtime env setup failed"), 1),
        (job("FAILED", f"{LOST_PREFIX} rank 1 (h, 10.0.0.2) while the job ran; rlrig stopped the job"), 3),
        (job("STOPPED", "Job was intentionally stopped."), submit.STOPPED_EXIT),
        (job("FAILED", "killed", -9), 1),
    ],
)
def test_submit_exits_with_the_jobs_result(j, code):
    assert submit.exit_code(j) == code


@pytest.mark.parametrize(
    "given,env,url",
    [
        (None, {}, "http://127.0.0.1:8265"),
        (None, {"RAY_ADDRESS": "http://localhost:8265"}, "http://localhost:8265"),  # the seeds' dstack way
        (None, {"RAY_ADDRESS": "10.0.0.1:6379"}, "http://127.0.0.1:8265"),  # a GCS address is not the job API
        (None, {"RAY_API_SERVER_ADDRESS": "http://h:8265/", "RAY_ADDRESS": "http://other:8265"}, "http://h:8265"),
        ("https://ray.example:443", {"RAY_ADDRESS": "http://other:8265"}, "https://ray.example:443"),
    ],
)
def test_job_api_address(given, env, url):
    assert submit.address(given, env) == url


def test_an_address_that_is_not_a_url_is_refused():
    with pytest.raises(RigError, match="give the job API's URL"):
        submit.address("10.0.0.1:6379", {})


def test_runtime_env_from_file_json_and_working_dir(tmp_path):
    f = tmp_path / "env.yaml"
    f.write_text("env_vars:\n  A: '1'\nworking_dir: /elsewhere\n")
    assert submit.runtime_env(str(f), None, None) == {"env_vars": {"A": "1"}, "working_dir": "/elsewhere"}
    assert submit.runtime_env(str(f), None, str(tmp_path))["working_dir"] == str(tmp_path)  # --working-dir wins
    assert submit.runtime_env(None, '{"pip": ["x"]}', None) == {"pip": ["x"]}
    assert submit.runtime_env(None, None, None) == {}


@pytest.mark.parametrize(
    "file_text,json_text,working_dir,words",
    [
        (None, "{nope", None, "--runtime-env-json is not valid JSON"),
        (None, "[1, 2]", None, "must be a mapping"),
        ("a: [1,\n", None, None, "is not valid YAML"),
        (None, None, "/no/such/dir", "--working-dir /no/such/dir is not a directory"),
    ],
)
def test_runtime_env_refusals(tmp_path, file_text, json_text, working_dir, words):
    path = None
    if file_text is not None:
        path = tmp_path / "env.yaml"
        path.write_text(file_text)
    with pytest.raises(RigError, match=words):
        submit.runtime_env(str(path) if path else None, json_text, working_dir)


def test_missing_runtime_env_file():
    with pytest.raises(RigError, match="--runtime-env /no/file cannot be read"):
        submit.runtime_env("/no/file", None, None)


def test_entrypoint_is_joined_as_ray_job_submit_joins_it():
    assert submit.entrypoint(["python3", "-c", "print('a b')"]) == "python3 -c 'print('\"'\"'a b'\"'\"')'"
    with pytest.raises(RigError, match="no command given"):
        submit.entrypoint([])


def node(rank=None, nnodes=None, state="ALIVE", ip="10.0.0.1", host=None, cpu=2.0, gpu=0.0):
    labels = {}
    if rank is not None:
        labels[coordination.RANK_LABEL] = str(rank)
    if nnodes is not None:
        labels[coordination.NNODES_LABEL] = str(nnodes)
    if host:
        labels[coordination.HOST_LABEL] = host
    return {
        "node_id": f"id-{ip}",
        "node_ip": ip,
        "node_name": ip,
        "state": state,
        "labels": labels,
        "resources_total": {"CPU": cpu, "GPU": gpu},
    }


@pytest.mark.parametrize(
    "nodes,expected",
    [
        ([], (0, 1)),  # a dashboard that just started lists nobody yet
        ([node(0, 2)], (1, 2)),
        ([node(0, 2), node(1, 2, ip="10.0.0.2")], (2, 2)),
        # a rank that joined and left (lost, drained) is not waited for: the trainer checks its own node count
        ([node(0, 2), node(1, 2, state="DEAD")], (1, 1)),
        ([node(0, 2), node(1, 2, state="DEAD"), node(1, 2, ip="10.0.0.2")], (2, 2)),  # and back
        ([node()], (0, 0)),  # a cluster rlrig did not start: ready as soon as it answers
    ],
)
def test_readiness(nodes, expected):
    assert submit.readiness(nodes) == expected


def test_status_rows_and_table():
    rows = status.node_rows(
        [
            node(1, 2, ip="10.0.0.2", host="b", gpu=8),
            node(1, 2, ip="10.0.0.9", state="DEAD"),
            node(0, 2, host="a"),
            node(ip="10.0.0.5"),
        ]
    )
    assert [(r["rank"], r["ip"], r["alive"]) for r in rows] == [
        (0, "10.0.0.1", True),
        (1, "10.0.0.2", True),
        (1, "10.0.0.9", False),
        (None, "10.0.0.5", True),
    ]
    assert rows[1]["gpus"] == 8 and rows[0]["host"] == "a" and rows[3]["host"] == "10.0.0.5"
    jobs = status.job_rows([Job("b", "RUNNING", "x" * 100, 2000, "", None), Job("a", "SUCCEEDED", "echo", 1000, "", 0)])
    assert [j["id"] for j in jobs] == ["a", "b"]
    text = status.render(rows, jobs, "http://127.0.0.1:8265")
    assert text.splitlines()[0] == "cluster http://127.0.0.1:8265: 3 node(s) alive"
    assert "rank  host" in text and "..." in text
    assert json.loads(status.as_json(rows, jobs, "u"))["nodes"][0]["rank"] == 0


@pytest.mark.parametrize(
    "nodes, ids",
    [
        ([node(1, 2, ip="10.0.0.2"), node(0, 2)], ["id-10.0.0.1"]),  # the head, where the trainer's driver runs
        ([node(0, 2, state="DEAD"), node(0, 2, ip="10.0.0.3")], ["id-10.0.0.3"]),  # its restarted record
        ([node(ip="10.0.0.5"), node(ip="10.0.0.6", state="DEAD")], ["id-10.0.0.5"]),  # not rlrig's: every alive one
    ],
)
def test_the_trainer_boards_are_read_on_the_head(nodes, ids):
    assert status.driver_nodes(nodes) == ids


def test_training_boards_in_the_table_and_json():
    from rlrig.trainer.driver.watchdog import BOARD_PREFIX

    assert BOARD_PREFIX == status.BOARD_PREFIX  # what the trainer writes is what status reads
    ranks = [
        {"label": "rank 0", "ip": "10.0.0.1", "phase": "update_actor", "step": 3, "seconds": 41.26},
        {"label": "rank 1", "ip": "10.0.0.2", "phase": "", "step": 0, "seconds": 0.0},
    ]
    line = json.dumps({"written": 1000.0, "ranks": ranks})
    boards = status.training_boards([{"rlrig-phases-02000000.json": line}], now=1001.5)
    assert boards == [{"job": "02000000", "age_s": 1.5, "ranks": ranks}]
    text = status.render([], [], "u", boards).splitlines()
    assert text[-4:] == [
        "training (Ray job 02000000): each rank's phase",
        "rank    node      phase            step  seconds in it",
        "rank 0  10.0.0.1  update_actor     3     41.3",
        "rank 1  10.0.0.2  (between steps)  -     -",
    ]
    stale = status.training_boards([{"rlrig-phases-02000000.json": line}], now=1060.0)
    assert "not updated for 60s: its trainer is gone or stuck" in status.render([], [], "u", stale)
    assert json.loads(status.as_json([], [], "u", boards))["training"][0]["ranks"][0]["phase"] == "update_actor"


def test_client_token_sources(tmp_path):
    assert auth.client_token({"RLRIG_CLUSTER_TOKEN": "x"}, home=tmp_path) == ("x", "RLRIG_CLUSTER_TOKEN")
    assert auth.client_token({"RAY_AUTH_TOKEN": "y"}, home=tmp_path) == ("y", "RAY_AUTH_TOKEN")
    with pytest.raises(RigError, match="no cluster token to send"):
        auth.client_token({}, home=tmp_path)
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text("z\n")  # Ray's own default, as `ray job submit` reads it
    assert auth.client_token({}, home=tmp_path) == ("z", str(tmp_path / ".ray" / "auth_token"))


def test_a_standing_cluster_never_makes_up_its_own_token():
    with pytest.raises(RigError, match="rlrig up needs a token"):
        auth.resolve_token({}, 1, shared=True)
    assert auth.resolve_token({}, 1)[1] == "generated (single node)"


@pytest.mark.parametrize(
    "mode,env,expected,external",
    [
        (None, {}, {}, False),
        ("post-mortem", {}, {"RAY_DEBUG_POST_MORTEM": "1"}, False),
        ("legacy", {}, {"RAY_DEBUG": "legacy"}, True),
    ],
)
def test_debug_modes(mode, env, expected, external):
    got = debugmode.debug_env(mode)
    assert got == expected
    assert debugmode.debugger_external({**env, **got}) is external


@pytest.mark.parametrize("env", [{"RAY_DEBUG_POST_MORTEM": "1", "RAY_DEBUG": "legacy"}])
def test_post_mortem_refuses_the_legacy_flags(env):
    with pytest.raises(RigError, match="unset RAY_DEBUG"):
        debugmode.check(env)
    debugmode.check({"RAY_DEBUG_POST_MORTEM": "0", "RAY_DEBUG": "legacy"})


def test_prestart_selects_what_ray_workers_read_at_start():
    env = {
        "PATH": "/bin",
        "VLLM_ATTENTION_BACKEND": "XFORMERS",
        "RAY_AUTH_TOKEN": "secret",
        "RAY_AUTH_MODE": "token",
        "NCCL_SOCKET_IFNAME": "eth0",
        "FOO": "bar",
        "HOME": "/root",
    }
    picked = prestart.select(env, {"FOO": "bar"})
    assert picked == {
        "FOO": "bar",
        "NCCL_SOCKET_IFNAME": "eth0",
        "RAY_AUTH_MODE": "token",
        "VLLM_ATTENTION_BACKEND": "XFORMERS",
    }
    assert "secret" not in prestart.one_line(picked)


@pytest.mark.parametrize(
    "requested,host,bound",
    [
        ("", "127.0.0.1", "127.0.0.1"),
        ("0.0.0.0", "127.0.0.1", "127.0.0.1"),
        ("::", "10.0.0.2", "10.0.0.2"),
        ("127.0.0.1", "10.0.0.2", "127.0.0.1"),  # Ray's own loopback choice stays
    ],
)
def test_metrics_bind_host(requested, host, bound):
    assert metricsbind.bind_host(requested, host) == bound


@pytest.mark.parametrize(
    "argv,patched",
    [
        (["/venv/lib/ray/dashboard/dashboard.py", "--host=127.0.0.1"], True),
        (["/venv/lib/ray/dashboard/agent.py"], True),
        (["/venv/lib/ray/autoscaler/_private/monitor.py"], True),
        (["/venv/lib/ray/_private/workers/default_worker.py"], False),  # Ray workers and job drivers are left alone
        (["-c"], False),
    ],
)
def test_metrics_hook_only_in_rays_metrics_servers(argv, patched):
    assert metricsbind.is_ray_server(argv) is patched


def test_the_shim_binds_a_wildcard_server_to_loopback_and_runs_the_sitecustomize_it_shadows(tmp_path):
    """A real interpreter with the shim first on its path, posing as Ray's dashboard."""
    hook = metricsbind.write_shim(str(tmp_path / "hook"))
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.OTHER_SITECUSTOMIZE = True\n")
    fake = tmp_path / "ray" / "dashboard" / "dashboard.py"
    fake.parent.mkdir(parents=True)
    fake.write_text(
        textwrap.dedent("""
        import builtins
        from prometheus_client import start_http_server
        server, _ = start_http_server(0)
        print(server.server_address[0], getattr(builtins, "OTHER_SITECUSTOMIZE", False))
        server.shutdown()
    """)
    )
    env = {"PYTHONPATH": f"{hook}:{other}", metricsbind.HOST_VAR: "127.0.0.1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, str(fake)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["127.0.0.1", "True"]
    plain = tmp_path / "plain.py"
    plain.write_text(fake.read_text())
    r = subprocess.run([sys.executable, str(plain)], env=env, capture_output=True, text=True, timeout=60)
    assert r.stdout.split()[0] == "0.0.0.0"  # not one of Ray's servers: untouched


def test_ray_start_gets_the_hook_the_interpreters_bin_and_the_metrics_host():
    from rlrig.entrypoint.preflight.checks import Preflight

    env = raystart.start_env(
        {"PATH": "/usr/bin", "PYTHONPATH": "/mine"}, {}, Preflight(), {}, "/tmp/t", None, "10.0.0.2"
    )
    assert env["PATH"].split(":")[0] == str(__import__("pathlib").Path(sys.executable).parent)
    assert env["PYTHONPATH"] == "/tmp/t/pyhook:/mine" and env[metricsbind.HOST_VAR] == "10.0.0.2"


@pytest.mark.parametrize(
    "text,value",
    [
        ("gpu-node-7.cluster.local", "gpu-node-7.cluster.local"),
        ("weird host!", "weird-host"),
        ("-x-", "x"),
        ("", "unknown"),
        ("a" * 80, "a" * 63),
    ],
)
def test_label_values(text, value):
    assert raystart.label_value(text) == value


@pytest.mark.parametrize(
    "host,url",
    [
        ("127.0.0.1", "http://127.0.0.1:8265"),
        ("0.0.0.0", "http://127.0.0.1:8265"),
        ("::", "http://[::1]:8265"),
        ("10.0.0.2", "http://10.0.0.2:8265"),
    ],
)
def test_the_head_reaches_its_own_dashboard(host, url):
    assert bootstrap.dashboard_url(host) == url


@pytest.mark.parametrize(
    "address,is_gcs",
    [
        ("10.0.0.1:6379", True),
        ("[fe80::1]:6379", True),
        ("auto", False),
        ("ray://h:10001", False),
        ("http://h:8265", False),
    ],
)
def test_trainer_check_applies_to_gcs_addresses(address, is_gcs):
    assert trainerfit.is_gcs_address(address) is is_gcs


@pytest.mark.parametrize(
    "nnodes,ranks,pool,words",
    [
        (2, [0, 1], 0, None),
        (1, [], 0, None),
        (3, [0, 1], 0, "trainer.nnodes=3 but the cluster at a:1 has 2 node(s) (ranks 0, 1); set trainer.nnodes=2"),
        (1, [1, 0], 0, "set trainer.nnodes=2"),
        # the reward model's own pool: on its own node, or sharing the training nodes
        (2, [0, 1, 2], 1, None),
        (2, [0, 1], 1, None),
        (1, [0, 1, 2], 1, "trainer.nnodes=1 and 1 node(s) in pools of their own but the cluster at a:1 has 3 node(s)"),
    ],
)
def test_trainer_nnodes_must_match_the_cluster(nnodes, ranks, pool, words):
    got = trainerfit.mismatch(nnodes, ranks, "a:1", pool)
    assert (got is None) if words is None else (words in got)


def test_doctor_shows_what_must_be_set_before_ray_starts(monkeypatch, tmp_path):
    from rlrig.entrypoint import doctor
    from tests.helpers.entrypoint_fakes import collector

    monkeypatch.chdir(tmp_path)
    found = bootstrap.inspect(
        {"VLLM_ATTENTION_BACKEND": "XFORMERS", "RLRIG_ENV_A": "1", "PATH": "/bin", "RLRIG_CLUSTER_TOKEN": "secret"},
        collect=collector(),
    )
    shown = doctor.as_dict(found)["before_ray_start"]
    assert shown["VLLM_ATTENTION_BACKEND"] == "XFORMERS" and shown["A"] == "1" and shown["RAY_AUTH_MODE"] == "token"
    assert "PATH" not in shown and "secret" not in json.dumps(shown)
    assert "  VLLM_ATTENTION_BACKEND=XFORMERS" in doctor.as_text(found)
