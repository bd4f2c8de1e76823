"""The fabric check's transports (entrypoint/fabric/links.py) on loopback: TCP pairs of real sockets in threads, the
ring all-reduce's transfers among three ranks, a silent peer timing out as the check reports it; and the torch path
(NCCL's code) over Gloo in two processes."""

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlrig.entrypoint.fabric import links, protocol
from rlrig.entrypoint.fabric.probe import Probe

pytestmark = pytest.mark.process

IP = "127.0.0.1"


def test_a_pair_over_tcp_measures_both_directions_and_the_round_trip():
    head, peer = Probe(torch_now=False), Probe(torch_now=False)
    head.server, peer.server = links.listener(IP), links.listener(IP)
    peers = [(IP, head.server.getsockname()[1]), (IP, peer.server.getsockname()[1])]
    assert head.join(None, 0, 2, "tcp", peers) and peer.join(None, 1, 2, "tcp", peers)
    with ThreadPoolExecutor(2) as pool:
        lead = pool.submit(head.pair, 1, 1 << 20, True)
        other = pool.submit(peer.pair, 0, 1 << 20, False)
        lead, other = lead.result(30), other.result(30)
    assert lead["mb_s"] > 0 and lead["rtt_ms"] > 0 and other["mb_s"] > 0, (lead, other)
    with ThreadPoolExecutor(2) as pool:  # the all-reduce over the same two listeners
        res = [pool.submit(p.allreduce, 1 << 20, 2) for p in (head, peer)]
        assert all(r.result(30)["seconds"] > 0 for r in res)


def test_the_ring_moves_two_n_minus_one_chunks_on_every_rank():
    servers = [links.listener(IP) for _ in range(3)]
    addrs = [(IP, s.getsockname()[1]) for s in servers]
    with ThreadPoolExecutor(3) as pool:
        runs = [
            pool.submit(
                links.ring_allreduce,
                lambda t, i=i: links.accept(servers[i], t),
                lambda t, i=i: links.connect(addrs[(i + 1) % 3], t),
                *(3, 3 << 20, 3, 10.0, 10.0),
            )
            for i in range(3)
        ]
        assert all(len(t) == 3 and min(t) > 0 for t in (r.result(30) for r in runs))


def test_a_silent_peer_times_out_and_is_reported_as_such():
    server = links.listener(IP)
    quiet = links.connect((IP, server.getsockname()[1]), 5.0)  # connects, then never sends
    link = links.TcpLink(links.accept(server, 5.0), 1 << 20)
    with pytest.raises(TimeoutError) as e:
        link.recv_payload(1 << 20, 0.3)
    assert (
        protocol.transfer_error(e.value, "the transfer to rank 0", 0.3) == "the transfer to rank 0 timed out after 0.3s"
    )
    quiet.close()
    with pytest.raises(ConnectionError):  # and a peer that went away is an error, not a hang
        link.recv_small(5.0)


def _torch_worker(rank: int, port: int, queue) -> None:
    import torch.distributed as dist

    probe = Probe(torch_now=True)
    probe.join((IP, port), rank, 2, "gloo")  # the NCCL path's code, driven over Gloo on the CPU
    queue.put((rank, (probe.pair(1 - rank, 1 << 20, rank == 0), probe.allreduce(1 << 20, 2))))
    dist.destroy_process_group()


def test_the_torch_path_measures_a_pair_and_an_all_reduce():
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_torch_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    (lead, ar0), (peer, ar1) = got[0], got[1]
    assert lead["mb_s"] > 0 and lead["rtt_ms"] > 0 and peer["mb_s"] > 0, got
    assert ar0["seconds"] > 0 and ar1["seconds"] > 0, got
