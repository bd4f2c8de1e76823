"""One row per launcher and form: environment in, node spec out."""

import pytest

from rlrig.entrypoint.detect.detection import detect
from rlrig.entrypoint.errors import RigError

HOST = "node2"

ROWS = [
    # (id, env, expected subset of the spec)
    ("nothing", {}, dict(launcher="local", node_rank=0, nnodes=1, head_host="127.0.0.1")),
    (
        "dstack",
        {
            "DSTACK_NODE_RANK": "1",
            "DSTACK_NODES_NUM": "2",
            "DSTACK_MASTER_NODE_IP": "10.0.0.1",
            "DSTACK_NODES_IPS": "10.0.0.1\n10.0.0.2\n",
            "DSTACK_GPUS_PER_NODE": "8",
            "DSTACK_RUN_NAME": "r1",
        },
        dict(
            launcher="dstack",
            node_rank=1,
            nnodes=2,
            head_host="10.0.0.1",
            gpus_allotted=8,
            node_ip_hint="10.0.0.2",
            job_id="r1",
        ),
    ),
    (
        "slurm step",
        {
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_STEP_NODELIST": "node[1-2]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
            "SLURM_GPUS_ON_NODE": "4",
            "SLURM_CPUS_PER_TASK": "16",
        },
        dict(
            launcher="slurm", node_rank=1, nnodes=2, head_host="node1", gpus_allotted=4, cpus_allotted=16, job_id="77.0"
        ),
    ),
    (
        "slurm step uses step list",
        {
            "SLURM_JOB_ID": "9",
            "SLURM_STEP_ID": "3",
            "SLURM_NTASKS": "2",
            "SLURM_NODEID": "0",
            "SLURM_JOB_NUM_NODES": "4",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu-[0-3]",
            "SLURM_STEP_NODELIST": "gpu-[2-3]",
        },
        dict(node_rank=0, nnodes=2, head_host="gpu-2"),
    ),
    (
        "slurm single-node batch",
        {
            "SLURM_JOB_ID": "5",
            "SLURM_NTASKS": "1",
            "SLURM_JOB_NUM_NODES": "1",
            "SLURM_JOB_NODELIST": "linux[0007]",
            "SLURM_CPUS_ON_NODE": "8",
        },
        dict(launcher="slurm", nnodes=1, head_host="linux0007", cpus_allotted=8),
    ),
    (
        "skypilot",
        {
            "SKYPILOT_NODE_RANK": "0",
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NODE_IPS": "10.1.0.5\n10.1.0.6",
            "SKYPILOT_NUM_GPUS_PER_NODE": "1",
        },
        dict(
            launcher="skypilot",
            node_rank=0,
            nnodes=2,
            head_host="10.1.0.5",
            gpus_allotted=1,
            ray_start_args=[],
        ),
    ),
    (
        "lws",
        {"LWS_LEADER_ADDRESS": "grp-0.svc", "LWS_WORKER_INDEX": "3", "LWS_GROUP_SIZE": "4"},
        dict(launcher="lws", node_rank=3, nnodes=4, head_host="grp-0.svc"),
    ),
    (
        "pytorchjob",
        {"MASTER_ADDR": "job-master-0", "RANK": "2", "WORLD_SIZE": "3", "PET_NPROC_PER_NODE": "8"},
        dict(launcher="pytorchjob", node_rank=2, nnodes=3, head_host="job-master-0", gpus_allotted=8),
    ),
    (
        "pytorchjob PET",
        {"MASTER_ADDR": "m", "RANK": "0", "PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto"},
        dict(node_rank=1, nnodes=2, gpus_allotted=None),
    ),
    (
        "indexed job",
        {"JOB_COMPLETION_INDEX": "1", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "js-w-0-0.sub"},
        dict(launcher="indexed-job", node_rank=1, nnodes=2, head_host="js-w-0-0.sub"),
    ),
    (
        "torchrun",
        {
            "TORCHELASTIC_RUN_ID": "abc",
            "GROUP_RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "10.2.0.1",
            "RANK": "1",
        },
        dict(launcher="torchrun", node_rank=1, nnodes=2, head_host="10.2.0.1", job_id="abc"),
    ),
    (
        "openmpi",
        {
            "OMPI_COMM_WORLD_SIZE": "2",
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
            "RLRIG_HEAD_ADDRESS": "10.3.0.1",
        },
        dict(launcher="mpi", node_rank=1, nnodes=2, head_host="10.3.0.1"),
    ),
    (
        "intel mpi",
        {"PMI_RANK": "0", "PMI_SIZE": "3", "RLRIG_HEAD_ADDRESS": "h0"},
        dict(launcher="mpi", node_rank=0, nnodes=3),
    ),
    (
        "lsf mcpu",
        {"LSB_JOBID": "12", "LSB_MCPU_HOSTS": "hostA 2 node2 2"},
        dict(launcher="lsf", node_rank=1, nnodes=2, head_host="hostA", job_id="12"),
    ),
    (
        "sagemaker",
        {"SM_CURRENT_HOST": "algo-2", "SM_HOSTS": '["algo-1","algo-2"]', "SM_NUM_GPUS": "4"},
        dict(launcher="sagemaker", node_rank=1, nnodes=2, head_host="algo-1", gpus_allotted=4),
    ),
    (
        "kuberay",
        {"RAY_CLUSTER_NAME": "rc", "RAY_ADDRESS": "http://rc-head:8265"},
        dict(launcher="kuberay", existing_ray="http://rc-head:8265"),
    ),
    ("existing RAY_ADDRESS", {"RAY_ADDRESS": "10.9.0.1:6379"}, dict(launcher="local", existing_ray="10.9.0.1:6379")),
    (
        "explicit (compose)",
        {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "head:6380"},
        dict(launcher="explicit", node_rank=1, nnodes=2, head_host="head", port=6380),
    ),
    (
        "explicit wins over dstack",
        {
            "DSTACK_NODE_RANK": "0",
            "DSTACK_NODES_NUM": "2",
            "DSTACK_MASTER_NODE_IP": "10.0.0.1",
            "RLRIG_NODE_RANK": "1",
            "RLRIG_HEAD_ADDRESS": "10.5.0.1",
            "RLRIG_NUM_GPUS": "2",
        },
        dict(launcher="dstack", node_rank=1, nnodes=2, head_host="10.5.0.1", gpus_allotted=2),
    ),
    (
        "ipv6 with port",
        {"RLRIG_NNODES": "2", "RLRIG_NODE_RANK": "0", "RLRIG_HEAD_ADDRESS": "[fd00::1]:7000"},
        dict(head_host="fd00::1", port=7000),
    ),
    (
        "bare ipv6",
        {"RLRIG_NNODES": "2", "RLRIG_NODE_RANK": "0", "RLRIG_HEAD_ADDRESS": "fd00::1"},
        dict(head_host="fd00::1", port=6379),
    ),
]


@pytest.mark.parametrize("env,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_detect(env, expected):
    spec = detect(env, hostname=HOST)
    got = {k: getattr(spec, k) for k in expected}
    assert got == expected


def test_file_launchers(tmp_path):
    pbs = tmp_path / "nodes"
    pbs.write_text("node1\nnode1\nnode2\nnode2\n")
    spec = detect({"PBS_JOBID": "3.pbs", "PBS_NODEFILE": str(pbs)}, hostname="node2.cluster")
    assert (spec.launcher, spec.node_rank, spec.nnodes, spec.head_host) == ("pbs", 1, 2, "node1")
    rank = tmp_path / "rankfile"
    rank.write_text("hA\nhA\nhB\nnode2\n")
    spec = detect({"LSB_JOBID": "4", "LSB_DJOB_RANKFILE": str(rank)}, hostname=HOST)
    assert (spec.launcher, spec.node_rank, spec.nnodes) == ("lsf", 2, 3)


def test_forced_launcher():
    env = {"DSTACK_NODE_RANK": "0", "SLURM_JOB_ID": "1", "SLURM_NTASKS": "1"}
    assert detect(env, launcher="slurm", hostname=HOST).launcher == "slurm"


BAD = [
    ("unknown launcher", {}, "slrum", "did you mean 'slurm'"),
    (
        "rank out of range",
        {"RLRIG_NODE_RANK": "2", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "h"},
        None,
        "outside 0..1",
    ),
    ("no head", {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "2"}, None, "RLRIG_HEAD_ADDRESS"),
    ("not integer", {"RLRIG_NODE_RANK": "one"}, None, "RLRIG_NODE_RANK='one' is not an integer"),
    (
        "slurm batch script",
        {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]"},
        None,
        "srun --ntasks-per-node=1",
    ),
    (
        "slurm two tasks per node",
        {
            "SLURM_JOB_ID": "1",
            "SLURM_STEP_ID": "0",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
            "SLURM_JOB_NODELIST": "n[1-2]",
        },
        None,
        "exactly one per node",
    ),
    (
        "slurm bad hostlist",
        {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n[1-"},
        None,
        "SLURM_JOB_NODELIST",
    ),
    # as `sbatch -N 2` really sets it: no SLURM_NTASKS, no SLURM_STEP_ID
    (
        "slurm sbatch -N2 script",
        {
            "SLURM_JOB_ID": "1",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_NNODES": "2",
            "SLURM_NODEID": "0",
            "SLURM_TASKS_PER_NODE": "1(x2)",
            "SLURM_JOB_NODELIST": "n[1-2]",
        },
        None,
        "srun --ntasks-per-node=1",
    ),
    (
        "mpi two ranks per node",
        {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
        None,
        "ppr:1:node",
    ),
    (
        "torchrun nproc",
        {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16", "GROUP_RANK": "0"},
        None,
        "--nproc-per-node=1",
    ),
    ("sagemaker bad json", {"SM_CURRENT_HOST": "a", "SM_HOSTS": "a,b"}, None, "SM_HOSTS"),
    ("pbs host missing", {"PBS_JOBID": "1", "PBS_NODEFILE": "/nonexistent/nodes"}, None, "cannot be read"),
]


@pytest.mark.parametrize("env,launcher,message", [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_bad_env(env, launcher, message):
    with pytest.raises(RigError, match=None) as e:
        detect(env, launcher=launcher, hostname=HOST)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


# Each launcher's own variables, never RLRIG_* ones the user did not set, in its range errors.
RANK_ERRORS = [
    # (launcher, env with a rank outside its node count, the variables the message must name)
    (
        "dstack",
        {"DSTACK_NODE_RANK": "3", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "10.0.0.1"},
        ["DSTACK_NODE_RANK=3", "DSTACK_NODES_NUM=2"],
    ),
    (
        "slurm",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0",
            "SLURM_NODEID": "2",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": "n[1-2]",
        },
        ["SLURM_NODEID=2", "SLURM_STEP_NUM_NODES=2"],
    ),
    (
        "slurm",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0",
            "SLURM_NODEID": "1",
            "SLURM_NNODES": "1",
            "SLURM_STEP_NODELIST": "n1",
        },
        ["SLURM_NODEID=1", "SLURM_NNODES=1"],
    ),
    (
        "skypilot",
        {"SKYPILOT_NODE_RANK": "2", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.1.0.5\n10.1.0.6"},
        ["SKYPILOT_NODE_RANK=2", "SKYPILOT_NUM_NODES=2"],
    ),
    (
        "lws",
        {"LWS_LEADER_ADDRESS": "g-0", "LWS_WORKER_INDEX": "4", "LWS_GROUP_SIZE": "4"},
        ["LWS_WORKER_INDEX=4", "LWS_GROUP_SIZE=4"],
    ),
    ("pytorchjob", {"MASTER_ADDR": "m", "RANK": "3", "WORLD_SIZE": "2"}, ["RANK=3", "WORLD_SIZE=2"]),
    (
        "pytorchjob",
        {"MASTER_ADDR": "m", "RANK": "0", "PET_NODE_RANK": "2", "PET_NNODES": "2"},
        ["PET_NODE_RANK=2", "PET_NNODES=2"],
    ),
    (
        "torchrun",
        {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "2", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "m"},
        ["GROUP_RANK=2", "WORLD_SIZE=2"],
    ),
    (
        "mpi",
        {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "2", "RLRIG_HEAD_ADDRESS": "h"},
        ["OMPI_COMM_WORLD_RANK=2", "OMPI_COMM_WORLD_SIZE=2"],
    ),
    ("mpi", {"PMI_RANK": "5", "PMI_SIZE": "3", "RLRIG_HEAD_ADDRESS": "h"}, ["PMI_RANK=5", "PMI_SIZE=3"]),
    (
        "indexed-job",
        {"JOB_COMPLETION_INDEX": "1"},
        ["JOB_COMPLETION_INDEX=1", "RLRIG_NNODES (unset; indexed-job does not give"],
    ),
    (
        "explicit",
        {"RLRIG_NODE_RANK": "2", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "h"},
        ["RLRIG_NODE_RANK=2", "RLRIG_NNODES=2"],
    ),
    # an explicit override is named as what it is, next to the launcher's own variable it replaced
    (
        "dstack",
        {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "10.0.0.1", "RLRIG_NNODES": "1"},
        ["DSTACK_NODE_RANK=1", "RLRIG_NNODES=1"],
    ),
]


@pytest.mark.parametrize("launcher,env,names", RANK_ERRORS, ids=[f"{r[0]}-{i}" for i, r in enumerate(RANK_ERRORS)])
def test_rank_error_names_the_launchers_own_variables(launcher, env, names):
    with pytest.raises(RigError) as e:
        detect(env, hostname=HOST)
    message = str(e.value)
    assert message.startswith(f"{launcher}: node rank")
    for name in names:
        assert name in message, message
    named = {w.split("=")[0] for w in message.replace(",", " ").split() if "=" in w}
    assert named <= {n.split("=")[0].split()[0] for n in names}, f"names variables it did not read: {message}"


HEAD_ERRORS = [
    ("dstack", {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2"}, "DSTACK_MASTER_NODE_IP and DSTACK_NODES_IPS unset"),
    ("skypilot", {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"}, "SKYPILOT_NODE_IPS unset"),
    (
        "torchrun",
        {"TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"},
        "MASTER_ADDR unset",
    ),
    ("mpi", {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}, "mpi does not give it"),
    ("indexed-job", {"JOB_COMPLETION_INDEX": "1", "RLRIG_NNODES": "2"}, "indexed-job does not give it"),
    ("explicit", {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "2"}, "RLRIG_HEAD_ADDRESS unset"),
]


@pytest.mark.parametrize("launcher,env,why", HEAD_ERRORS, ids=[r[0] for r in HEAD_ERRORS])
def test_unknown_head_says_what_the_launcher_lacks(launcher, env, why):
    with pytest.raises(RigError) as e:
        detect(env, hostname=HOST)
    assert str(e.value).startswith(f"{launcher}: the head node's address is not known ({why})"), str(e.value)
    assert "set RLRIG_HEAD_ADDRESS=" in str(e.value)


SOURCES = [
    (
        "dstack",
        {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2", "DSTACK_NODES_IPS": "10.0.0.1\n10.0.0.2"},
        {"node_rank": "DSTACK_NODE_RANK", "nnodes": "DSTACK_NODES_NUM", "head_host": "DSTACK_NODES_IPS"},
    ),
    (
        "slurm",
        {
            "SLURM_JOB_ID": "7",
            "SLURM_STEP_ID": "0",
            "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_NODES": "2",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_STEP_NODELIST": "n[1-2]",
            "SLURM_JOB_NODELIST": "n[1-2]",
        },
        {"node_rank": "SLURM_NODEID", "nnodes": "SLURM_STEP_NUM_NODES", "head_host": "SLURM_STEP_NODELIST"},
    ),
    ("local", {}, {"node_rank": "", "nnodes": "", "head_host": ""}),
    (
        "dstack over-ridden",
        {
            "DSTACK_NODE_RANK": "1",
            "DSTACK_NODES_NUM": "2",
            "DSTACK_MASTER_NODE_IP": "10.0.0.1",
            "RLRIG_HEAD_ADDRESS": "10.5.0.1",
        },
        {"node_rank": "DSTACK_NODE_RANK", "nnodes": "DSTACK_NODES_NUM", "head_host": "RLRIG_HEAD_ADDRESS"},
    ),
]


@pytest.mark.parametrize("env,sources", [r[1:] for r in SOURCES], ids=[r[0] for r in SOURCES])
def test_spec_records_where_rank_nodes_and_head_came_from(env, sources):
    assert detect(env, hostname=HOST).sources == sources


def test_forced_launcher_without_its_variables():
    with pytest.raises(RigError, match="--launcher slurm: this environment has no SLURM_JOB_ID"):
        detect({}, launcher="slurm", hostname=HOST)
    with pytest.raises(RigError, match="RLRIG_LAUNCHER mpi: this environment has no OMPI_COMM_WORLD_SIZE or PMIX_RANK"):
        detect({"RLRIG_LAUNCHER": "mpi"}, hostname=HOST)
    assert detect({"SLURM_JOB_ID": "1"}, launcher="local", hostname=HOST).launcher == "local"


def test_explicit_rank_covers_a_host_missing_from_the_host_file(tmp_path):
    nodes = tmp_path / "nodes"
    nodes.write_text("a\nb\n")
    env = {"PBS_JOBID": "3", "PBS_NODEFILE": str(nodes)}
    with pytest.raises(RigError, match="set RLRIG_NODE_RANK"):
        detect(env, hostname="elsewhere")
    spec = detect({**env, "RLRIG_NODE_RANK": "1"}, hostname="elsewhere")
    assert (spec.node_rank, spec.nnodes, spec.head_host, spec.sources["node_rank"]) == (1, 2, "a", "RLRIG_NODE_RANK")


MORE_BAD = [
    (
        "head port not a number",
        {"RLRIG_NNODES": "2", "RLRIG_NODE_RANK": "1", "RLRIG_HEAD_ADDRESS": "h:http"},
        "not a number",
    ),
    ("blank dstack rank", {"DSTACK_NODE_RANK": " "}, "DSTACK_NODE_RANK is set but blank"),
    ("sagemaker not a list", {"SM_CURRENT_HOST": "a", "SM_HOSTS": '"a"'}, "not a JSON list"),
    ("lsf without hosts", {"LSB_JOBID": "1"}, "LSB_MCPU_HOSTS lists no hosts"),
    (
        "slurm bad step list",
        {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-"},
        "SLURM_STEP_NODELIST",
    ),
]


@pytest.mark.parametrize("env,message", [r[1:] for r in MORE_BAD], ids=[r[0] for r in MORE_BAD])
def test_more_bad_input_is_a_rig_error(env, message):
    with pytest.raises(RigError) as e:
        detect(env, hostname=HOST)
    assert message in str(e.value)


def test_port_out_of_range():
    with pytest.raises(RigError, match="Ray port 70000 is not a TCP port"):
        detect({"RLRIG_RAY_PORT": "70000"}, hostname=HOST)


def test_slurm_names_what_it_read_outside_a_step():
    # the batch step of a one-node job: step variables present, but the job's are the ones read
    env = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "batch",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_JOB_NODELIST": "a1",
        "SLURM_STEP_NODELIST": "b1",
    }
    spec = detect(env, hostname=HOST)
    assert spec.head_host == "a1"
    assert spec.sources == {"node_rank": "", "nnodes": "SLURM_JOB_NUM_NODES", "head_host": "SLURM_JOB_NODELIST"}
