"""One row per launcher and form: environment in, node spec out."""

import pytest

from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.launchers import detect

HOST = "node2"

ROWS = [
    # (id, env, expected subset of the spec)
    ("nothing", {}, dict(launcher="local", node_rank=0, nnodes=1, head_host="127.0.0.1")),
    ("dstack", {"DSTACK_NODE_RANK": "1", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "10.0.0.1",
                "DSTACK_NODES_IPS": "10.0.0.1\n10.0.0.2\n", "DSTACK_GPUS_PER_NODE": "8", "DSTACK_RUN_NAME": "r1"},
     dict(launcher="dstack", node_rank=1, nnodes=2, head_host="10.0.0.1", gpus_allotted=8, node_ip_hint="10.0.0.2", job_id="r1")),
    ("slurm step", {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "2", "SLURM_NODEID": "1",
                    "SLURM_JOB_NUM_NODES": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]",
                    "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_GPUS_ON_NODE": "4",
                    "SLURM_CPUS_PER_TASK": "16"},
     dict(launcher="slurm", node_rank=1, nnodes=2, head_host="node1", gpus_allotted=4, cpus_allotted=16, job_id="77.0")),
    ("slurm step uses step list", {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "3", "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
                                   "SLURM_JOB_NUM_NODES": "4", "SLURM_STEP_NUM_NODES": "2",
                                   "SLURM_JOB_NODELIST": "gpu-[0-3]", "SLURM_STEP_NODELIST": "gpu-[2-3]"},
     dict(node_rank=0, nnodes=2, head_host="gpu-2")),
    ("slurm single-node batch", {"SLURM_JOB_ID": "5", "SLURM_NTASKS": "1", "SLURM_JOB_NUM_NODES": "1",
                                 "SLURM_JOB_NODELIST": "linux[0007]", "SLURM_CPUS_ON_NODE": "8"},
     dict(launcher="slurm", nnodes=1, head_host="linux0007", cpus_allotted=8)),
    ("skypilot", {"SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.1.0.5\n10.1.0.6",
                  "SKYPILOT_NUM_GPUS_PER_NODE": "1"},
     dict(launcher="skypilot", node_rank=0, nnodes=2, head_host="10.1.0.5", gpus_allotted=1,
          ray_start_args=["--dashboard-agent-listen-port=52366"])),
    ("lws", {"LWS_LEADER_ADDRESS": "grp-0.svc", "LWS_WORKER_INDEX": "3", "LWS_GROUP_SIZE": "4"},
     dict(launcher="lws", node_rank=3, nnodes=4, head_host="grp-0.svc")),
    ("pytorchjob", {"MASTER_ADDR": "job-master-0", "RANK": "2", "WORLD_SIZE": "3", "PET_NPROC_PER_NODE": "8"},
     dict(launcher="pytorchjob", node_rank=2, nnodes=3, head_host="job-master-0", gpus_allotted=8)),
    ("pytorchjob PET", {"MASTER_ADDR": "m", "RANK": "0", "PET_NODE_RANK": "1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto"},
     dict(node_rank=1, nnodes=2, gpus_allotted=None)),
    ("indexed job", {"JOB_COMPLETION_INDEX": "1", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "js-w-0-0.sub"},
     dict(launcher="indexed-job", node_rank=1, nnodes=2, head_host="js-w-0-0.sub")),
    ("torchrun", {"TORCHELASTIC_RUN_ID": "abc", "GROUP_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                  "MASTER_ADDR": "10.2.0.1", "RANK": "1"},
     dict(launcher="torchrun", node_rank=1, nnodes=2, head_host="10.2.0.1", job_id="abc")),
    ("openmpi", {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                 "RLRIG_HEAD_ADDRESS": "10.3.0.1"},
     dict(launcher="mpi", node_rank=1, nnodes=2, head_host="10.3.0.1")),
    ("intel mpi", {"PMI_RANK": "0", "PMI_SIZE": "3", "RLRIG_HEAD_ADDRESS": "h0"}, dict(launcher="mpi", node_rank=0, nnodes=3)),
    ("lsf mcpu", {"LSB_JOBID": "12", "LSB_MCPU_HOSTS": "hostA 2 node2 2"},
     dict(launcher="lsf", node_rank=1, nnodes=2, head_host="hostA", job_id="12")),
    ("sagemaker", {"SM_CURRENT_HOST": "algo-2", "SM_HOSTS": '["algo-1","algo-2"]', "SM_NUM_GPUS": "4"},
     dict(launcher="sagemaker", node_rank=1, nnodes=2, head_host="algo-1", gpus_allotted=4)),
    ("kuberay", {"RAY_CLUSTER_NAME": "rc", "RAY_ADDRESS": "http://rc-head:8265"},
     dict(launcher="kuberay", existing_ray="http://rc-head:8265")),
    ("existing RAY_ADDRESS", {"RAY_ADDRESS": "10.9.0.1:6379"}, dict(launcher="local", existing_ray="10.9.0.1:6379")),
    ("explicit (compose)", {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "head:6380"},
     dict(launcher="explicit", node_rank=1, nnodes=2, head_host="head", port=6380)),
    ("explicit wins over dstack", {"DSTACK_NODE_RANK": "0", "DSTACK_NODES_NUM": "2", "DSTACK_MASTER_NODE_IP": "10.0.0.1",
                                   "RLRIG_NODE_RANK": "1", "RLRIG_HEAD_ADDRESS": "10.5.0.1", "RLRIG_NUM_GPUS": "2"},
     dict(launcher="dstack", node_rank=1, nnodes=2, head_host="10.5.0.1", gpus_allotted=2)),
    ("ipv6 with port", {"RLRIG_NNODES": "2", "RLRIG_NODE_RANK": "0", "RLRIG_HEAD_ADDRESS": "[fd00::1]:7000"},
     dict(head_host="fd00::1", port=7000)),
    ("bare ipv6", {"RLRIG_NNODES": "2", "RLRIG_NODE_RANK": "0", "RLRIG_HEAD_ADDRESS": "fd00::1"}, dict(head_host="fd00::1", port=6379)),
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
    ("rank out of range", {"RLRIG_NODE_RANK": "2", "RLRIG_NNODES": "2", "RLRIG_HEAD_ADDRESS": "h"}, None, "outside 0..1"),
    ("no head", {"RLRIG_NODE_RANK": "1", "RLRIG_NNODES": "2"}, None, "RLRIG_HEAD_ADDRESS"),
    ("not integer", {"RLRIG_NODE_RANK": "one"}, None, "RLRIG_NODE_RANK='one' is not an integer"),
    ("slurm batch script", {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NUM_NODES": "2",
                            "SLURM_JOB_NODELIST": "n[1-2]"}, None, "srun --ntasks-per-node=1"),
    ("slurm two tasks per node", {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NUM_NODES": "2",
                                  "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_NODELIST": "n[1-2]"}, None, "exactly one per node"),
    ("slurm bad hostlist", {"SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n[1-"},
     None, "SLURM_JOB_NODELIST"),
    # as `sbatch -N 2` really sets it: no SLURM_NTASKS, no SLURM_STEP_ID
    ("slurm sbatch -N2 script", {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
                                 "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "n[1-2]"}, None, "srun --ntasks-per-node=1"),
    ("mpi two ranks per node", {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
     None, "ppr:1:node"),
    ("torchrun nproc", {"TORCHELASTIC_RUN_ID": "x", "LOCAL_WORLD_SIZE": "8", "WORLD_SIZE": "16", "GROUP_RANK": "0"}, None,
     "--nproc-per-node=1"),
    ("sagemaker bad json", {"SM_CURRENT_HOST": "a", "SM_HOSTS": "a,b"}, None, "SM_HOSTS"),
    ("pbs host missing", {"PBS_JOBID": "1", "PBS_NODEFILE": "/nonexistent/nodes"}, None, "cannot be read"),
]


@pytest.mark.parametrize("env,launcher,message", [r[1:] for r in BAD], ids=[r[0] for r in BAD])
def test_bad_env(env, launcher, message):
    with pytest.raises(RigError, match=None) as e:
        detect(env, launcher=launcher, hostname=HOST)
    assert message in str(e.value)
    assert "\n" not in str(e.value)
