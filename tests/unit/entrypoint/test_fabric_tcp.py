"""The in-process fabric check (entrypoint/fabric/tcp.py) on loopback: three nodes' probe servers in this process, the
head's side measuring them; a connection without the cluster's token measured nothing; and the transfer sizes that
grow until a transfer is long enough to be sure of (protocol.timed_receive), on a link with a simulated clock."""

import pytest

from rlrig.entrypoint.fabric import protocol
from rlrig.entrypoint.fabric import tcp as fabric_tcp

IP = "127.0.0.1"
TOKEN = "t" * 64
# Loopback on a busy two-core machine measures one node at under half another's rate now and then (seen: 8.7 against
# 18.6 GB/s), so these protocol tests set no bandwidth floor; the floor's verdict is test_fabric_verdict's, on fixed
# figures.
NO_FLOOR = 0.0


@pytest.fixture
def servers():
    made = [fabric_tcp.ProbeServer(IP, TOKEN) for _ in range(3)]
    yield made
    for s in made:
        s.close()


def nodes_of(servers) -> list[dict]:
    return [{"rank": i, "host": f"h{i}", "ip": IP, "probe": s.address} for i, s in enumerate(servers)]


def test_the_head_measures_every_node_and_the_ring_from_its_own_process(servers):
    report = fabric_tcp.check(nodes_of(servers), servers[0], TOKEN, NO_FLOOR)
    assert report["verdict"] == "passed" and report["backend"] == "tcp", report
    for n in report["nodes"][1:]:
        assert n["mb_s"] > 0 and n["to_mb_s"] > 0 and n["from_mb_s"] > 0 and n["rtt_ms"] > 0, n
        assert n["gpus"] == [] and n["gpu_probe"], n  # no GPU here: NVML and amdsmi say why
    assert report["allreduce"]["seconds"] > 0 and report["allreduce"]["busbw_mb_s"] > 0, report
    assert set(report["phases_s"]) == {"start", "pairs", "allreduce"} and report["seconds"] > 0, report
    again = fabric_tcp.check(nodes_of(servers), servers[0], TOKEN, NO_FLOOR)  # after a restart in place: same servers
    assert again["verdict"] == "passed", again


def test_without_the_token_a_node_measures_nothing_and_the_check_names_it(servers):
    report = fabric_tcp.check(nodes_of(servers), servers[0], "not the cluster's", NO_FLOOR)
    assert report["verdict"] == "failed" and [f["rank"] for f in report["failed"]] == [1, 2], report
    assert "the round trip with rank 0 failed" in report["nodes"][1]["error"], report
    assert report["allreduce"] == {"skipped": "a node failed the pairwise check"}


def test_a_node_whose_probe_is_gone_fails_named(servers):
    servers[2].close()
    report = fabric_tcp.check(nodes_of(servers), servers[0], TOKEN, NO_FLOOR)
    assert [f["rank"] for f in report["failed"]] == [2], report
    assert report["nodes"][2]["error"].startswith(f"its fabric probe at {IP}:"), report
    assert report["nodes"][1]["mb_s"] > 0


def test_close_ends_the_servers_thread():
    server = fabric_tcp.ProbeServer(IP, TOKEN)
    assert server.thread.is_alive()
    server.close()
    server.thread.join(5)
    assert not server.thread.is_alive()


class ClockLink:
    """A link at `mb_s` on a simulated clock: the sizes asked for, and each transfer taking its bytes / rate."""

    def __init__(self, mb_s: float, clock: list[float]):
        self.mb_s, self.clock, self.asked = mb_s, clock, []

    def send_small(self, value: int, timeout: float) -> None:
        self.asked.append(value)

    def recv_payload(self, nbytes: int, timeout: float) -> None:
        self.clock[0] += nbytes / 1e6 / self.mb_s


@pytest.mark.parametrize(
    "mb_s, asked",
    [
        (1000.0, [1, 2, 3, 4, 4, 4, 0]),  # fast: up to 4 MiB, best of three there
        (50.0, [1, 2, 3, 4, 4, 4, 0]),  # 1 MiB takes 21 ms, too short to be sure of
        (2.5, [1, 2, 2, 2, 0]),  # 20 Mbit/s: 256 KiB takes 105 ms; three of those, not 1.7 s over 4 MiB
        (0.5, [1, 1, 1, 0]),  # 64 KiB takes 0.13 s
        (0.1, [1, 0]),  # 64 KiB takes 0.66 s, over REPEAT_WITHIN: clear at once
    ],
)
def test_transfers_grow_until_one_is_long_enough_to_be_sure_of(monkeypatch, mb_s, asked):
    clock = [0.0]
    monkeypatch.setattr(protocol.time, "perf_counter", lambda: clock[0])
    link = ClockLink(mb_s, clock)
    assert protocol.timed_receive(link) == pytest.approx(mb_s)
    assert link.asked == asked


def test_a_ring_connection_left_from_an_earlier_ring_is_not_taken(servers):
    """A ring that broke can leave its connection waiting at a node; the next ring's leg takes its own."""
    key = fabric_tcp.key_of(TOKEN)
    stale = fabric_tcp.dial(servers[1].address, key, {"op": "ring-in", "ring": "an-old-ring"}, 5.0)
    report = fabric_tcp.check(nodes_of(servers), servers[0], TOKEN, NO_FLOOR)
    assert report["verdict"] == "passed" and report["allreduce"]["seconds"] > 0, report
    stale.close()
