"""Every launch file checked by its own project's parser or linter, and for rank logic it must not have."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--", *patterns], cwd=REPO, capture_output=True, text=True).stdout
    return sorted(REPO / line for line in out.splitlines())


SHELL_SCRIPTS = tracked("*.sh", "*.sbatch", ".ci/run")
DSTACK = sorted(REPO.glob("dstack/*.yml"))
SKY = sorted(REPO.glob("skypilot/*.yaml"))
SKY_PY = REPO / ".venv-sky/bin/python"  # SkyPilot pins click below what transformers needs: its own venv
# what per-rank shell logic looks like in the launch scripts users used to write
RANK_LOGIC = re.compile(r"if\s*\[\[?.*(RANK|NODEID|PROCID|MASTER)", re.I)


def tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        pytest.fail(f"{name} is missing: it comes with `pip install -e .[test]` (tests/run.sh does it)")
    return path


def test_there_are_launch_files():
    assert DSTACK and SKY and len(SHELL_SCRIPTS) >= 6


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: str(p.relative_to(REPO)))
def test_shellcheck(script):
    r = subprocess.run([tool("shellcheck"), "-x", str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_hadolint_clean_at_error_level():
    r = subprocess.run(
        [tool("hadolint"), "--failure-threshold", "error", str(REPO / "docker/Dockerfile")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_cuda_image_driver_label_is_what_doctor_checks():
    """The CUDA image's driver minimum (a build.sh literal) and preflight's table for torch's CUDA 13 must agree."""
    from rlrig.entrypoint.preflight.checks import MIN_DRIVER_FOR_CUDA

    label = re.search(r"CUDA_DRIVER_MIN=([\d.]+)", (REPO / "docker/build.sh").read_text()).group(1)
    assert label == MIN_DRIVER_FOR_CUDA[13]


def test_dockerfile_entrypoint_and_arbitrary_uid():
    text = (REPO / "docker/Dockerfile").read_text()
    assert 'ENTRYPOINT ["/usr/bin/tini", "-g", "--", "rlrig"]' in text
    assert "ARG VARIANT" in text and "ARG BASE_IMAGE" in text and "USER 1000" in text
    assert "chmod -R 1777 /home/rlrig /workspace" in text


@pytest.mark.parametrize("path", DSTACK, ids=lambda p: p.name)
def test_dstack_yaml_parses_with_dstacks_own_models(path):
    from dstack._internal.core.models.configurations import TaskConfiguration, parse_run_configuration

    data = yaml.safe_load(path.read_text())
    conf = parse_run_configuration(data)
    assert isinstance(conf, TaskConfiguration)
    assert conf.image and conf.image.startswith("ghcr.io/rlrig/rlrig:")
    assert conf.resources.shm_size is not None
    assert any(p.container_port == 8265 for p in conf.ports)
    for cmd in conf.commands:
        assert "rlrig " in cmd or cmd.startswith("rlrig")
        assert not RANK_LOGIC.search(cmd) and "ray start" not in cmd, cmd


def test_dstack_has_a_two_node_task_with_the_token_as_secret():
    confs = {p.name: yaml.safe_load(p.read_text()) for p in DSTACK}
    multi = [c for c in confs.values() if c.get("nodes", 1) == 2]
    assert multi, "no nodes: 2 task"
    assert "RLRIG_CLUSTER_TOKEN=${{ secrets.rlrig_cluster_token }}" in multi[0]["env"]
    assert any(c.get("nodes", 1) == 1 for c in confs.values())


def test_dstack_multinode_task_comes_back_after_an_interruption_or_a_failure():
    from dstack._internal.core.models.configurations import parse_run_configuration

    conf = parse_run_configuration(yaml.safe_load((REPO / "dstack/grpo-multinode.dstack.yml").read_text()))
    assert {e.value for e in conf.retry.on_events} == {"no-capacity", "interruption", "error"}
    assert conf.retry.duration == 6 * 3600
    assert any("/checkpoints" in c for c in conf.commands) and conf.volumes  # where the retried run resumes from


def test_dstack_parser_rejects_a_broken_file():
    from dstack._internal.core.errors import ConfigurationError
    from dstack._internal.core.models.configurations import parse_run_configuration

    data = yaml.safe_load(DSTACK[0].read_text())
    data["nodes"] = 0
    with pytest.raises(ConfigurationError):
        parse_run_configuration(data)


@pytest.mark.parametrize("path", SKY, ids=lambda p: p.name)
def test_skypilot_yaml_parses_with_skypilots_own_parser(path):
    if not SKY_PY.exists():
        pytest.skip("SkyPilot's parser lives in .venv-sky, made by tests/run.sh")
    code = (
        "import sys, sky; t = sky.Task.from_yaml(sys.argv[1]); "
        "print(t.num_nodes, sorted(t.envs), [r.image_id for r in t.resources]); "
        "print('RECOVERY', [r.job_recovery for r in t.resources], sorted(t.storage_mounts))"
    )
    r = subprocess.run([str(SKY_PY), "-c", code, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("2 "), r.stdout
    # a managed job comes back after a preemption or a failure, and finds its checkpoints in a bucket
    assert "RECOVERY [{'strategy': 'FAILOVER', 'max_restarts_on_errors': 3}] ['/checkpoints']" in r.stdout, r.stdout
    data = yaml.safe_load(path.read_text())
    assert "rlrig train" in data["run"] and not RANK_LOGIC.search(data["run"])
    assert "6380" not in data["run"]  # SkyPilot's own Ray port stays SkyPilot's


def test_apptainer_definition_parses():
    from spython.main.parse.parsers import SingularityParser

    (stage,) = SingularityParser(str(REPO / "apptainer/rlrig.def")).recipe.values()
    assert stage.fromHeader.startswith("ghcr.io/rlrig/rlrig:")
    assert stage.cmd == 'exec /opt/rlrig/bin/rlrig "$@"'
    assert "RAY_USAGE_STATS_ENABLED=0" in stage.environ


def test_compose_file():
    data = yaml.safe_load((REPO / "compose/compose.yaml").read_text())
    head, worker = data["services"]["head"], data["services"]["worker"]
    for svc, rank in ((head, "0"), (worker, "1")):
        assert svc["init"] is True and svc["shm_size"] and svc["ulimits"]["nofile"]["soft"] == "${RLRIG_NOFILE:-65536}"
        assert svc["environment"]["RLRIG_NODE_RANK"] == rank and svc["environment"]["RLRIG_HEAD_ADDRESS"] == "head"
        assert "RLRIG_CLUSTER_TOKEN" in svc["environment"]
    gpu = yaml.safe_load((REPO / "compose/compose.gpu.yaml").read_text())
    assert gpu["services"]["head"]["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]


def test_dstack_standing_cluster_task():
    from dstack._internal.core.models.configurations import parse_run_configuration

    data = yaml.safe_load((REPO / "dstack/ray-cluster.dstack.yml").read_text())
    conf = parse_run_configuration(data)
    assert conf.nodes == 2 and conf.commands == ["rlrig up"]
    assert [p.container_port for p in conf.ports] == [8265]
    assert "RLRIG_CLUSTER_TOKEN=${{ secrets.rlrig_cluster_token }}" in data["env"]


def test_dstack_forwards_a_port_to_loopback_inside_the_run():
    """What `dstack apply` does with `ports`: the laptop's localhost:8265 to `localhost:8265` in the run's first
    job, over SSH; so rlrig's loopback-only job API is what it reaches."""
    from dstack._internal.core.services.ssh.tunnel import ports_to_forwarded_sockets

    (pair,) = ports_to_forwarded_sockets({8265: 8265})
    assert (pair.remote.host, pair.remote.port) == ("localhost", 8265)
    assert (pair.local.host, pair.local.port) == ("localhost", 8265)


def test_compose_cluster_profile():
    data = yaml.safe_load((REPO / "compose/compose.cluster.yaml").read_text())
    head, worker = data["services"]["head"], data["services"]["worker"]
    assert head["command"] == ["up", "--dashboard-host", "0.0.0.0"] and worker["command"] == ["up"]
    assert head["ports"] == ["127.0.0.1:8265:8265"]  # published on the host's loopback only
    assert set(data["services"]) == set(yaml.safe_load((REPO / "compose/compose.yaml").read_text())["services"])


def test_standing_slurm_recipe_has_no_sleeps_and_no_rank_logic():
    text = (REPO / "slurm/rlrig-cluster.sbatch").read_text()
    assert '"$rlrig" up' in text and '"$rlrig" submit' in text and '"$rlrig" down' in text
    commands = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    assert not any("sleep " in line for line in commands) and not RANK_LOGIC.search(text)
    r = subprocess.run(
        [tool("shellcheck"), "-x", str(REPO / "slurm/rlrig-cluster.sbatch")], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout
