"""The fabric check's verdict (which node fails, and the message that names it), its GPU readings, how the head runs
it and what it makes of its exit; the measuring itself runs on namespace nodes (tests/integration/test_fabric.py)."""

import json
import sys
import time
from types import SimpleNamespace

import pytest

from rlrig.entrypoint import bootstrap, cli, command
from rlrig.entrypoint.errors import RigError
from rlrig.entrypoint.fabric import protocol, verdict
from rlrig.entrypoint.fabric import report as fabric_report
from rlrig.entrypoint.preflight import inventory
from tests.helpers.entrypoint_fakes import collector


def node(rank, mb_s=None, error="", gpus=()):
    return {
        "rank": rank,
        "host": f"h{rank}",
        "ip": f"10.0.0.{rank + 1}",
        "mb_s": mb_s,
        "error": error,
        "gpus": list(gpus),
    }


def gpu(**readings):
    return {"index": 3, "name": "NVIDIA H100", **readings}


HEAD = node(0)  # the other end of every pair: no figure of its own


@pytest.mark.parametrize(
    "figures, min_ratio, failing, message",
    [
        # all alike: nobody fails
        ([900, 1000, 1100], 0.5, [], ""),
        # one link at 20 Mbit/s among 10 Gbit/s ones
        ([1000, 2.4, 1100], 0.5, [2], "rank 2 (h2, 10.0.0.3): 2.4 MB/s, below 0.5 x the median 1000.0 MB/s"),
        # two workers: the median is their mean, and the slow one is still far below half of it
        ([1000, 2.4], 0.5, [2], "rank 2 (h2, 10.0.0.3): 2.4 MB/s, below 0.5 x the median 501.2 MB/s"),
        # just at the line passes; just below fails
        ([1000, 500, 1000], 0.5, [], ""),
        ([1000, 499, 1000], 0.5, [2], "rank 2 (h2, 10.0.0.3): 499.0 MB/s, below 0.5 x the median 1000.0 MB/s"),
        # a stricter ratio catches a milder straggler
        ([1000, 700, 1000], 0.8, [2], "rank 2 (h2, 10.0.0.3): 700.0 MB/s, below 0.8 x the median 1000.0 MB/s"),
        # ratio 0: only failures count
        ([1000, 0.1, 1000], 0.0, [], ""),
        # one worker: it is its own median, nothing to compare with
        ([3.0], 0.5, [], ""),
        # two slow ones out of five, both named in rank order
        (
            [1000, 3.0, 1000, 1000, 2.0],
            0.5,
            [2, 5],
            "rank 2 (h2, 10.0.0.3): 3.0 MB/s, below 0.5 x the median 1000.0 MB/s; "
            "rank 5 (h5, 10.0.0.6): 2.0 MB/s, below 0.5 x the median 1000.0 MB/s",
        ),
    ],
)
def test_which_node_fails_on_bandwidth(figures, min_ratio, failing, message):
    nodes = [HEAD] + [node(r, f) for r, f in enumerate(figures, start=1)]
    v = verdict.judge(nodes, min_ratio)
    assert [f["rank"] for f in v["failed"]] == failing
    assert v["message"] == message and v["ok"] is (not failing)


def test_a_failed_pair_fails_its_node_and_stays_out_of_the_median():
    nodes = [HEAD, node(1, 1000), node(2, error="the transfer from rank 0 timed out after 10s"), node(3, 990)]
    v = verdict.judge(nodes, 0.5)
    assert v["median_mb_s"] == 995
    assert v["message"] == "rank 2 (h2, 10.0.0.3): the transfer from rank 0 timed out after 10s"


def test_the_head_fails_on_its_own_error_or_gpu_only():
    v = verdict.judge([node(0, error="its probe did not start within 30s"), node(1, 1000)], 0.5)
    assert [f["rank"] for f in v["failed"]] == [0] and v["message"].startswith("rank 0 (h0, 10.0.0.1): its probe")


def test_a_gpu_failure_fails_its_node_and_a_warning_does_not():
    nodes = [
        node(0, gpus=[gpu(slowdowns=["software thermal slowdown"])]),
        node(1, 1000, gpus=[gpu(), gpu(ecc_uncorrected=1)]),
        node(2, 1000),
    ]
    v = verdict.judge(nodes, 0.5)
    assert (
        v["message"] == "rank 1 (h1, 10.0.0.2): GPU 3 (NVIDIA H100): 1 uncorrected ECC error(s) since the driver loaded"
    )
    assert v["warnings"] == ["rank 0 (h0, 10.0.0.1): GPU 3 (NVIDIA H100): clocks held down (software thermal slowdown)"]


def test_node_lines_name_rank_host_ip_bandwidth_and_latency():
    n = {**node(2, 2.4), "to_mb_s": 2.4, "from_mb_s": 1100.0, "rtt_ms": 0.42}
    assert fabric_report.node_line(n) == (
        "rank 2 (h2, 10.0.0.3): 2.4 MB/s (from the head 2.4, to it 1100.0), round trip 0.42 ms; GPUs: none"
    )
    assert (
        fabric_report.node_line(node(0, gpus=[gpu()]))
        == "rank 0 (h0, 10.0.0.1): head (the other end of every pair); GPUs: 1"
    )
    assert "FAILED: the round trip" in fabric_report.node_line(
        node(1, error="the round trip with rank 0 timed out after 10s")
    )
    assert "not measured" in fabric_report.node_line(node(1))  # the group never formed: no figures, no error of its own


def test_failure_message(tmp_path):
    report = tmp_path / "fabric.json"
    report.write_text(json.dumps({"message": "rank 2 (h2, 10.0.0.3): 2.4 MB/s, below 0.5 x the median 1000.0 MB/s"}))
    assert fabric_report.failure_message(str(report), 2) == (
        f"fabric check failed: rank 2 (h2, 10.0.0.3): 2.4 MB/s, below 0.5 x the median 1000.0 MB/s; report {report}; "
        "rerun with --no-fabric-check to skip it"
    )
    # any other exit is the check breaking, not a verdict
    assert fabric_report.failure_message(str(report), 1).startswith(
        "fabric check could not run (exit 1); see its output above"
    )
    assert "could not run (exit 2)" in fabric_report.failure_message(str(tmp_path / "none.json"), 2)


# --- how the head runs it -------------------------------------------------------------------------------------


def fake_check(tmp_path, code: int, message: str = "", sleep: float = 0) -> list[str]:
    script = (
        f"import json, time; time.sleep({sleep}); "
        f"json.dump({{'message': {message!r}}}, open({str(tmp_path / fabric_report.REPORT_NAME)!r}, 'w')); "
        f"raise SystemExit({code})"
    )
    return [sys.executable, "-c", script]


def head_plan(tmp_path):
    return SimpleNamespace(temp_dir=str(tmp_path), fabric_min_ratio=0.5)


def test_the_head_goes_on_after_a_pass(tmp_path):
    command.check_fabric(head_plan(tmp_path), {}, lambda: None, command=fake_check(tmp_path, 0))


def test_the_head_stops_on_a_failed_check_naming_the_node(tmp_path):
    with pytest.raises(RigError) as e:
        command.check_fabric(
            head_plan(tmp_path), {}, lambda: None, command=fake_check(tmp_path, 2, "rank 2 (h2, 10.0.0.3): timed out")
        )
    assert e.value.exit_code == 2 and str(e.value).startswith("fabric check failed: rank 2 (h2, 10.0.0.3): timed out;")


def test_a_check_that_hangs_is_stopped_in_time(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(RigError, match="no verdict within 1s"):
        command.check_fabric(
            head_plan(tmp_path), {}, lambda: None, timeout=1, command=fake_check(tmp_path, 0, sleep=60)
        )
    assert time.monotonic() - t0 < 10


# --- the options ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv, check, ratio",
    [
        (["run", "--", "true"], True, 0.5),
        (["run", "--no-fabric-check", "--", "true"], False, 0.5),
        (["run", "--fabric-min-ratio", "0.3", "--", "true"], True, 0.3),
        (["train", "--fabric-min-ratio", "0.7"], True, 0.7),
        (["up"], False, 0.5),  # the standing cluster runs no command of its own
    ],
)
def test_options_reach_the_plan(monkeypatch, argv, check, ratio):
    seen = []
    monkeypatch.setattr(bootstrap, "plan", lambda options, env=None: seen.append(options))
    args = cli.build_parser().parse_args(argv)
    cli.make_plan(args, ["true"], standing=args.command == "up")
    assert (seen[0].fabric_check, seen[0].fabric_min_ratio) == (check, ratio)


def test_a_ratio_outside_0_to_1_is_refused(capsys):
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["run", "--fabric-min-ratio", "2", "--", "true"])
    assert "not a fraction from 0 to 1" in capsys.readouterr().err


def test_the_plan_carries_them(monkeypatch, tmp_path):
    monkeypatch.setattr(inventory, "collect", collector())
    monkeypatch.chdir(tmp_path)
    env = {
        "DSTACK_NODE_RANK": "0",
        "DSTACK_NODES_NUM": "2",
        "DSTACK_MASTER_NODE_IP": "10.0.0.2",
        "DSTACK_NODES_IPS": "10.0.0.2\n10.0.0.3",
        "DSTACK_RUN_NAME": "r1",
        "RLRIG_CLUSTER_TOKEN": "t" * 64,
    }
    p = bootstrap.plan(bootstrap.PlanOptions(["true"], fabric_check=True, fabric_min_ratio=0.25), env=env)
    assert (p.fabric_check, p.fabric_min_ratio) == (True, 0.25)
    assert (
        bootstrap.plan(bootstrap.PlanOptions(["true"]), env=env).fabric_check is False
    )  # off unless run/train asks for it


def measured(rank, to, back):
    return {**node(rank, min(to, back)), "to_mb_s": to, "from_mb_s": back, "rtt_ms": 0.1}


@pytest.mark.parametrize(
    "again, mb_s, tries, failing",
    [
        # a stall spoiled its first pair: measured again at full speed, it passes with its best
        ([(1000, 1000)], 1000, 2, []),
        # slow every time: measured AGAIN more times, then it fails
        ([(2.4, 2.4), (2.5, 2.3)], 2.4, 3, [2]),
        # measuring it again failed: its first figure stands (an error says nothing faster)
        ([None, None], 2.4, 1, [2]),
        # each direction keeps its best over the tries
        ([(2.4, 1000), (1000, 3.0)], 1000, 3, []),
    ],
)
def test_a_node_below_the_bar_is_measured_again_before_it_fails(again, mb_s, tries, failing):
    """Only the node below the bar is measured again, until it is not or AGAIN tries are spent."""
    nodes = [node(0), measured(1, 1000, 1100), measured(2, 2.4, 2.4), measured(3, 1100, 1000)]
    calls = []

    def measure(n):
        calls.append(n["rank"])
        figures = again[len(calls) - 1]
        n.update({"error": "the transfer to rank 0 timed out after 10s"} if figures is None else measured(2, *figures))

    protocol.measure_again(nodes, 0.5, time.monotonic() + 60, measure)
    assert calls == [2] * len(again) and protocol.AGAIN == 2
    assert nodes[2]["mb_s"] == mb_s and nodes[2].get("measured", 1) == tries, nodes[2]
    assert [f["rank"] for f in verdict.judge(nodes, 0.5)["failed"]] == failing
