"""bench/gpu_profile.py's reading of a profile, on the records a CUDA profile holds (no GPU here: the device's events
are stand-ins with Kineto's event API): each kernel counted once in the bucket of the op that launched it, and the
device timeline's annotations and host waits not counted as GPU work."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))
import gpu_profile  # noqa: E402

VOCAB = 1000


def op(name, id, parent=None, shapes=None):
    return SimpleNamespace(name=name, id=id, cpu_parent=parent, input_shapes=shapes or [], device_type=DeviceType.CPU)


STEP = op("Optimizer.step#AdamW.step", 1)
LOGPROB = op("ChunkedLogprob", 2)
LOGPROB_BWD = op("ChunkedLogprobBackward", 3)
OPS = [
    op("aten::mm", 10, shapes=[[64, 32], [32, VOCAB]]),
    op("aten::mm", 11, shapes=[[64, 32], [32, 32]]),
    op("aten::_grouped_mm", 12, shapes=[[64, 32], [8, 32, 16]]),
    op("aten::copy_", 13),
    op("aten::_fused_adamw_", 14, STEP),
    op("aten::exp", 15, LOGPROB),
    op("aten::mul", 16, LOGPROB_BWD),
    op("aten::_scaled_dot_product_cudnn_attention", 17),
    op("aten::add", 18),
    # a launch whose op the profile did not link: the op around its runtime event
    op("cudaLaunchKernel", 900, op("aten::mul", 19)),
]


@pytest.mark.parametrize(
    "name, op_id, launch_id, bucket",
    [
        ("nvjet_head", 10, 1, "head"),
        ("nvjet_body", 11, 1, "body matmuls"),
        ("grouped_gemm", 12, 1, "body matmuls"),
        ("direct_copy_kernel", 13, 1, "memcpy"),
        ("Memcpy DtoD (Device -> Device)", 18, 1, "memcpy"),
        ("multi_tensor_apply_kernel", 14, 1, "optimizer"),
        ("exp_kernel", 15, 1, "logprob fwd"),
        ("mul_kernel", 16, 1, "logprob bwd"),
        ("cudnn_sdpa_kernel", 17, 1, "attention"),
        ("add_kernel", 18, 1, "elementwise"),
        ("mul_kernel", 0, 900, "elementwise"),
        ("ncclDevKernel_AllGather", 0, 5, "comms"),
        ("unlinked", 0, 5, "elementwise"),
    ],
)
def test_each_kernel_lands_in_the_bucket_of_the_op_that_launched_it(name, op_id, launch_id, bucket):
    k = gpu_profile.Kernel(name, start_us=50.0, seconds=0.25, op_id=op_id, launch_id=launch_id)
    out = gpu_profile.buckets_of([k], OPS, (0.0, 1e6), VOCAB)
    assert {b: s for b, s in out.items() if s} == {bucket: 0.25, "GPU idle": 0.75}


def kineto(name, activity, start_us, dur_us, linked=0, annotation=False, device=DeviceType.CUDA, typed=True):
    event = SimpleNamespace(
        name=lambda: name,
        start_ns=lambda: 1_000_000 + int(start_us * 1000),
        duration_ns=lambda: int(dur_us * 1000),
        linked_correlation_id=lambda: linked,
        correlation_id=lambda: 7,
        device_type=lambda: device,
        is_user_annotation=lambda: annotation,
    )
    if typed:
        event.activity_type = lambda: activity
    return event


# torch 2.13's Kineto events say their activity type; torch 2.11's (the GPU machine's) do not
@pytest.mark.parametrize("typed", [True, False], ids=["torch 2.13", "torch 2.11"])
def test_annotations_and_host_waits_on_the_device_timeline_are_not_gpu_work(typed):
    """The phase's own range spans its kernels on the device timeline: counting it counted the update twice."""
    events = [
        ("phase/update_actor", 2, 0, 1000, 0, True),
        ("ChunkedLogprob", 2, 100, 300, 0, True),
        ("Command Buffer Full", 15, 0, 900, 0, False),
        ("Stream Sync", 15, 700, 200, 0, False),
        ("nvjet_body", 5, 20, 400, 11, False),
        ("Memcpy DtoD (Device -> Device)", 3, 500, 100, 18, False),
        ("Memset (Device)", 4, 650, 50, 18, False),
    ]
    results = SimpleNamespace(
        trace_start_ns=lambda: 1_000_000,
        events=lambda: (
            [kineto("aten::mm", 0, 10, 990, device=DeviceType.CPU, typed=typed)]
            + [kineto(*e[:5], annotation=e[5], typed=typed) for e in events]
        ),
    )
    work = gpu_profile.gpu_work(results)
    assert [(k.name, k.start_us, k.seconds, k.op_id) for k in work] == [
        ("nvjet_body", 20.0, 0.0004, 11),
        ("Memcpy DtoD (Device -> Device)", 500.0, 0.0001, 18),
        ("Memset (Device)", 650.0, 0.00005, 18),
    ]
    out = gpu_profile.buckets_of(work, OPS, (0.0, 1000.0), VOCAB)
    assert out["body matmuls"] == pytest.approx(0.0004) and out["memcpy"] == pytest.approx(0.00015)
    assert out["GPU idle"] == pytest.approx(0.001 - 0.00055)


def test_kernels_outside_the_phase_are_left_out():
    inside, after = (gpu_profile.Kernel(n, s, 0.1, 11, 1) for n, s in (("in", 10.0), ("after", 2e6)))
    assert gpu_profile.buckets_of([inside, after], OPS, (0.0, 1e6), VOCAB)["body matmuls"] == 0.1
