"""Which GPU a worker takes: Ray's default narrows the visible devices to it (index 0); under a NOSET flag (the ROCm
image sets the HIP one) every worker sees the node's GPUs and must take the one Ray assigned it."""

import os

import pytest

from rlrig.trainer.devices import gpu_index

CASES = [
    # (id, env, Ray's accelerator ids, index)
    ("ray narrows: always 0", {"CUDA_VISIBLE_DEVICES": "5"}, ["5"], 0),
    ("noset hip, no list", {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}, ["3"], 3),
    (
        "noset hip, node list",
        {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "4,5,6,7"},
        ["6"],
        2,
    ),
    (
        "noset cuda, node list",
        {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "2,3"},
        ["3"],
        1,
    ),
    ("noset flag empty", {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": ""}, ["3"], 0),
    (
        "the rocm image's list is HIP's",
        {
            "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1",
            "HIP_VISIBLE_DEVICES": "1,0",
            "CUDA_VISIBLE_DEVICES": "0,1",
        },
        ["0"],
        1,
    ),
]


@pytest.mark.parametrize("env,assigned,index", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gpu_index(env, assigned, index):
    assert gpu_index(env, assigned) == index


def test_a_worker_assigned_several_gpus_is_refused():
    with pytest.raises(RuntimeError, match=r"holds one GPU, but Ray assigned \['0', '1'\]"):
        gpu_index({"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"}, ["0", "1"])


OWN = {  # the variables a child process gets: only this worker's GPU, by the node's device id
    "ray narrows: always 0": {},
    "noset hip, no list": {"CUDA_VISIBLE_DEVICES": "3", "HIP_VISIBLE_DEVICES": "3"},
    "noset hip, node list": {"CUDA_VISIBLE_DEVICES": "6", "HIP_VISIBLE_DEVICES": "6"},
    "noset cuda, node list": {"CUDA_VISIBLE_DEVICES": "3"},
    "noset flag empty": {},
    "the rocm image's list is HIP's": {"CUDA_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"},
}


@pytest.mark.parametrize("name,env,assigned", [c[:3] for c in CASES], ids=[c[0] for c in CASES])
def test_a_child_process_sees_only_the_workers_gpu(name, env, assigned):
    from rlrig.trainer.devices import own_gpu_only

    assert own_gpu_only(env, assigned) == OWN[name]


@pytest.mark.parametrize(
    "env, assigned, expected",
    [
        ({"CUDA_VISIBLE_DEVICES": "4,5"}, ["4", "5"], {}),  # Ray narrowed the worker to its two GPUs already
        (
            {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
            ["2", "3"],
            {"CUDA_VISIBLE_DEVICES": "2,3"},
        ),
        (
            {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1"},
            ["0", "1"],
            {"CUDA_VISIBLE_DEVICES": "0,1", "HIP_VISIBLE_DEVICES": "0,1"},
        ),
    ],
)
def test_the_engine_of_a_worker_holding_several_gpus_sees_them_all(env, assigned, expected):
    from rlrig.trainer.devices import own_gpus_only

    assert own_gpus_only(env, assigned) == expected


def test_an_engine_over_several_workers_sees_the_groups_gpus():
    from rlrig.trainer.devices import showing

    assert showing("2,3", {"CUDA_VISIBLE_DEVICES": "2"}) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    hip = {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0,1,2,3"}
    assert showing("2,3", hip) == {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"}
    # CUDA_VISIBLE_DEVICES counts within what ROCR exposes: node ids there would name devices that are not there
    rocr = {"RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES": "1", "ROCR_VISIBLE_DEVICES": "0,1,2,3"}
    assert showing("2,3", rocr) == {"ROCR_VISIBLE_DEVICES": "2,3"}


@pytest.mark.parametrize(
    "env, shown",
    [
        ({"CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "2,3"}),
        # ROCm's engines refuse HIP_VISIBLE_DEVICES differing from CUDA_VISIBLE_DEVICES: both name the group's GPUs
        (
            {"RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES": "1", "HIP_VISIBLE_DEVICES": "0,1,2,3"},
            {"CUDA_VISIBLE_DEVICES": "2,3", "HIP_VISIBLE_DEVICES": "2,3"},
        ),
    ],
)
def test_an_engine_started_over_a_groups_gpus_sees_them_and_the_worker_its_own_after(monkeypatch, env, shown):
    from rlrig.trainer.rollout.tp_groups import with_devices

    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    seen = with_devices("2,3", lambda: {var: os.environ.get(var) for var in shown})
    assert seen == shown
    assert {var: os.environ.get(var) for var in shown} == {var: env.get(var) for var in shown}
