"""slurm/rlrig-podman.sbatch (+ rlrig-container-node.sh), slurm/rlrig-pyxis.sbatch (and, for spare nodes, the
bare-metal recipe), run as bash with stand-ins
for srun, scontrol and the container engine that record what they were handed: the arguments and the environment
each container would start with. (The podman recipe also runs for real on the two-node Slurm in tests/e2e.)"""

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[3]
TOKEN = "ab" * 32

# every stand-in: record (tool, arguments, environment), exit with EXIT_<TOOL> (default 0)
RECORD = """#!/usr/bin/env python3
import json, os, sys
tool, argv = sys.argv[1], sys.argv[2:]
with open(os.environ["RECORD_FILE"], "a") as f:
    f.write(json.dumps({"tool": tool, "argv": argv, "env": dict(os.environ)}) + "\\n")
sys.exit(int(os.environ.get("EXIT_" + tool.upper(), "0")))
"""
# srun records, then (SRUN_RUNS_TASK) runs the task's command as node 1's task: the container-node script. With
# SRUN_BAD="n2 n3", its Nth call plays a step whose head named the Nth node in the exclude file, and exits 5.
SRUN = """#!/usr/bin/env bash
python3 "$(dirname "$0")/record" srun "$@" || exit
calls=$(grep -c '"tool": "srun"' "$RECORD_FILE")
bad=(${SRUN_BAD:-})
if [ "$calls" -le "${#bad[@]}" ]; then
  echo "${bad[$((calls - 1))]}" >>"$HOST_EXCLUDE_FILE"
  exit 5
fi
[ -n "${SRUN_RUNS_TASK:-}" ] || exit 0
while [ $# -gt 0 ] && [[ "$1" == --* ]]; do shift; done
SLURM_NODEID=1 SLURM_PROCID=1 SLURM_LOCALID=0 exec "$@"
"""


# scontrol records; `show hostnames` expands this job's node list as Slurm would (n1, n2, n3)
SCONTROL = """#!/usr/bin/env bash
python3 "$(dirname "$0")/record" scontrol "$@" || exit
[ "$1 $2" = "show hostnames" ] && printf 'n%s\\n' $(seq "${SLURM_JOB_NUM_NODES:-2}")
exit 0
"""


def tool(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.fixture
def fakes(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    tool(bin_dir / "record", RECORD)
    tool(bin_dir / "srun", SRUN)
    for name in ("podman", "docker"):
        tool(bin_dir / name, f'#!/usr/bin/env bash\nexec python3 "$(dirname "$0")/record" {name} "$@"\n')
    tool(bin_dir / "scontrol", SCONTROL)
    record = tmp_path / "record.jsonl"
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "RECORD_FILE": str(record),
        "SLURM_JOB_ID": "77",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "n[1-2]",  # what the stand-in scontrol expands is SLURM_JOB_NUM_NODES' n1, n2, ...
        "SLURM_SUBMIT_DIR": str(tmp_path / "submit"),
        "RLRIG_CLUSTER_TOKEN": TOKEN,
    }
    (tmp_path / "submit").mkdir()
    (tmp_path / "submit" / "slurm").symlink_to(REPO / "slurm")

    def run(script: str, *args: str, **extra: str):
        r = subprocess.run(
            ["bash", str(REPO / script), *args], env={**env, **extra}, capture_output=True, text=True, timeout=60
        )
        calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
        return r, calls

    return run


def engine_call(calls):
    return next(c for c in calls if c["tool"] in ("podman", "docker"))


GPUS = [
    # (RLRIG_GPUS, SLURM_GPUS_PER_NODE, flags expected, trainer.device, n_gpus_per_node)
    (None, "8", ["--gpus", "all"], "cuda", "8"),
    (
        "amd",
        "8",
        ["--device", "/dev/kfd", "--device", "/dev/dri", "--group-add", "video", "--group-add", "render"],
        "cuda",
        "8",
    ),
    (None, None, [], "cpu", "1"),
]


@pytest.mark.parametrize("gpus,per_node,flags,device,n", GPUS)
def test_podman_recipe_hands_each_container_its_own_task_variables(fakes, gpus, per_node, flags, device, n):
    extra = {"CONTAINER_ENGINE": "podman", "SRUN_RUNS_TASK": "1", "RLRIG_IMAGE": "localhost/rlrig:cpu"}
    if gpus:
        extra["RLRIG_GPUS"] = gpus
    if per_node:
        extra["SLURM_GPUS_PER_NODE"] = per_node
    r, calls = fakes("slurm/rlrig-podman.sbatch", "trainer.total_training_steps=2", **extra)
    assert r.returncode == 0, r.stderr
    call = engine_call(calls)
    argv, env = call["argv"], call["env"]
    assert call["tool"] == "podman" and argv[0] == "run" and argv[argv.index("--network") + 1] == "host"
    passed = {argv[i + 1] for i, a in enumerate(argv) if a == "-e"}
    assert {"SLURM_NODEID", "SLURM_PROCID", "SLURM_JOB_ID", "SLURM_JOB_NUM_NODES", "RLRIG_CLUSTER_TOKEN"} <= passed
    assert env["SLURM_NODEID"] == "1" and env["RLRIG_CLUSTER_TOKEN"] == TOKEN
    assert TOKEN not in " ".join(argv)  # by name only: `ps` never shows it
    gpu_flags = [
        a
        for i, a in enumerate(argv)
        if a in ("--gpus", "--device", "--group-add") or argv[i - 1] in ("--gpus", "--device", "--group-add")
    ]
    assert gpu_flags == flags
    tail = argv[argv.index("localhost/rlrig:cpu") :]
    assert tail == [
        "localhost/rlrig:cpu",
        "train",
        "trainer.nnodes=2",
        f"trainer.n_gpus_per_node={n}",
        f"trainer.device={device}",
        "trainer.total_training_steps=2",
    ]
    assert any(v.endswith("/submit/outputs:/workspace/outputs") for v in argv)
    if os.getuid() == 0:  # the submitting user's files: root's here; rootless podman maps the user instead
        assert argv[argv.index("--user") + 1] == "0:0"
    else:
        assert argv[argv.index("--userns") + 1] == "keep-id"


def test_podman_recipe_requeues_on_the_warning_signal(fakes):
    r, calls = fakes("slurm/rlrig-podman.sbatch", EXIT_PODMAN="138", SRUN_RUNS_TASK="1", CONTAINER_ENGINE="podman")
    assert r.returncode == 138 and "requeueing job 77" in r.stdout
    assert [c["argv"] for c in calls if c["tool"] == "scontrol" and c["argv"][0] != "show"] == [["requeue", "77"]]


def test_container_node_refuses_an_unknown_gpu_kind(fakes):
    r, calls = fakes("slurm/rlrig-container-node.sh", "img", "train", RLRIG_GPUS="intel")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "RLRIG_GPUS=intel" in r.stderr and not calls


def test_pyxis_recipe(fakes):
    r, calls = fakes("slurm/rlrig-pyxis.sbatch", "data.train_batch_size=8", SLURM_GPUS_PER_NODE="8")
    assert r.returncode == 0, r.stderr
    (srun,) = [c for c in calls if c["tool"] == "srun"]
    argv, env = srun["argv"], srun["env"]
    opts = dict(a.split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    assert opts["--container-image"] == "ghcr.io#rlrig/rlrig:0.1.0-cuda"
    assert opts["--container-mounts"].endswith("/submit/outputs:/workspace/outputs")
    assert "--no-container-mount-home" in argv and "--container-writable" in argv
    command = argv[argv.index("/opt/rlrig/bin/rlrig") :]
    assert command == [
        "/opt/rlrig/bin/rlrig",
        "train",
        "trainer.nnodes=2",
        "trainer.n_gpus_per_node=8",
        "trainer.device=cuda",
        "data.train_batch_size=8",
    ]
    # pyxis hands the task's environment to the container: the token and Slurm's variables, HOME inside the image
    assert env["RLRIG_CLUSTER_TOKEN"] == TOKEN and env["SLURM_JOB_ID"] == "77" and env["HOME"] == "/home/rlrig"
    assert TOKEN not in " ".join(argv)


SPARE_RECIPES = [
    # (script, the exclude file as the batch script reads it, as the command (in its container) sees it)
    ("slurm/rlrig-baremetal.sbatch", "{submit}/rlrig-77.exclude", "{submit}/rlrig-77.exclude"),
    ("slurm/rlrig-podman.sbatch", "{submit}/outputs/rlrig-77.exclude", "/workspace/outputs/rlrig-77.exclude"),
    ("slurm/rlrig-pyxis.sbatch", "{submit}/outputs/rlrig-77.exclude", "/workspace/outputs/rlrig-77.exclude"),
    ("apptainer/rlrig-apptainer.sbatch", "{submit}/rlrig-77.exclude", "{submit}/rlrig-77.exclude"),
]


def recipe_needs(tmp_path: Path) -> dict[str, str]:
    """What the bare-metal and Apptainer recipes check before srun (a stand-in here): rlrig in RLRIG_VENV, the
    image at RLRIG_SIF."""
    (tmp_path / "venv" / "bin").mkdir(parents=True, exist_ok=True)
    tool(tmp_path / "venv" / "bin" / "rlrig", "")
    (tmp_path / "rlrig.sif").write_text("")
    return {"RLRIG_VENV": str(tmp_path / "venv"), "RLRIG_SIF": str(tmp_path / "rlrig.sif")}


@pytest.mark.parametrize("script, outside, inside", SPARE_RECIPES)
@pytest.mark.parametrize(
    "bad, code, said",
    [
        ([], 0, None),
        (["n2"], 0, "leaving out n2 (failed twice); launching the step again on a spare node (0 spare left)"),
        (["n2", "n3"], 5, "n2,n3 failed twice and no spare node is left (RLRIG_SPARE_NODES=1); stopping"),
    ],
)
def test_a_node_named_in_the_exclude_file_is_left_out_of_the_next_step(
    fakes, tmp_path, script, outside, inside, bad, code, said
):
    submit = tmp_path / "submit"
    (submit / "outputs").mkdir(exist_ok=True)  # as the container recipes make it
    (submit / "outputs").mkdir(exist_ok=True)  # the container recipes make it; the bare-metal one is handed it
    extra = {
        "SLURM_JOB_NUM_NODES": "3",
        "SLURM_GPUS_PER_NODE": "8",
        "RLRIG_SPARE_NODES": "1",
        "SRUN_BAD": " ".join(bad),
        "HOST_EXCLUDE_FILE": outside.format(submit=submit),
        **recipe_needs(tmp_path),
    }
    if "baremetal" in script:  # its default is beside the job's output, in the job's working directory
        extra["RLRIG_EXCLUDE_FILE"] = outside.format(submit=submit)
    r, calls = fakes(script, "--max-restarts", "1", "a.b=1", **extra)
    assert r.returncode == code, r.stdout + r.stderr
    sruns = [c for c in calls if c["tool"] == "srun"]
    assert len(sruns) == min(len(bad), 1) + 1
    for i, c in enumerate(sruns):
        assert "--nodes=2" in c["argv"] and "--ntasks=2" in c["argv"] and "trainer.nnodes=2" in c["argv"]
        assert c["argv"][-3:] == ["--max-restarts", "1", "a.b=1"]
        assert [a for a in c["argv"] if a.startswith("--exclude")] == (["--exclude=n2"] if i else [])
        assert c["env"]["RLRIG_EXCLUDE_FILE"] == inside.format(submit=submit)
    assert (said is None and "leaving out" not in r.stdout) or said in r.stdout, r.stdout


@pytest.mark.parametrize("script", [r[0] for r in SPARE_RECIPES])
def test_more_spares_than_nodes_is_refused(fakes, tmp_path, script):
    r, calls = fakes(
        script, SLURM_JOB_NUM_NODES="2", RLRIG_SPARE_NODES="2", SLURM_GPUS_PER_NODE="8", **recipe_needs(tmp_path)
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "RLRIG_SPARE_NODES=2 leaves none of the job's 2 node(s) to train on" in r.stderr
    assert not calls


@pytest.mark.parametrize("earlier, excluded", [("n9\n", []), ("n2\nn9\n", ["--exclude=n2"])])
def test_a_requeued_job_leaves_out_the_named_nodes_it_has(fakes, tmp_path, earlier, excluded):
    """The exclude file outlives a requeue: the next start leaves out those of its nodes it names, and only those
    (srun refuses to exclude a node the allocation lacks)."""
    submit = tmp_path / "submit"
    (submit / "outputs").mkdir(exist_ok=True)
    (submit / "outputs" / "rlrig-77.exclude").write_text(earlier)
    r, calls = fakes(
        "slurm/rlrig-podman.sbatch", SLURM_JOB_NUM_NODES="3", RLRIG_SPARE_NODES="1", SLURM_GPUS_PER_NODE="8"
    )
    assert r.returncode == 0, r.stderr
    (srun,) = [c for c in calls if c["tool"] == "srun"]
    assert [a for a in srun["argv"] if a.startswith("--exclude")] == excluded
