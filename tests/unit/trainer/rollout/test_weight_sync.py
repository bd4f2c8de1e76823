"""The rollout pool's weight sync: buckets cut the same on both sides, and a real Gloo group of three processes
(training rank 0 and two rollout workers) carrying a model's tensors bit for bit: from the trainer's parameters laid
out in the packing buffers, into a module's own parameters with no copy (Landing) on one receiver, handed over tensor
by tensor on the other."""

import hashlib
import multiprocessing as mp

import pytest
import torch

from rlrig.entrypoint.cluster.ports import kernel_free_port
from rlrig.trainer.rollout.weight_sync import Entry, Landing, SyncGroup, buckets, direct, in_place_target, layout

F32, BF16 = torch.float32, torch.bfloat16


@pytest.mark.parametrize(
    "entries, limit, cut",
    [
        # consecutive tensors share a bucket up to the limit (bytes: 4 per fp32 element)
        ([("a", (2,), F32), ("b", (2,), F32), ("c", (2,), F32)], 16, [["a", "b"], ["c"]]),
        # a dtype change starts a new bucket
        ([("a", (2,), F32), ("b", (2,), BF16), ("c", (2,), BF16)], 1024, [["a"], ["b", "c"]]),
        # a tensor larger than the limit travels alone
        ([("a", (1,), F32), ("big", (100,), F32), ("c", (1,), F32)], 16, [["a"], ["big"], ["c"]]),
        # so does one of DIRECT_BYTES or more, whatever the limit, and the run of small ones starts again after it
        ([("a", (1,), F32), ("d", (2**18,), F32), ("c", (1,), F32)], 2**30, [["a"], ["d"], ["c"]]),
    ],
)
def test_buckets(entries, limit, cut):
    got = buckets([Entry(n, s, d) for n, s, d in entries], limit)
    assert [[e.name for e in b] for b in got] == cut


def _module() -> torch.nn.Module:
    m = torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Linear(16, 16), torch.nn.LayerNorm(16))
    m[1].weight.data = m[1].weight.data.to(torch.bfloat16)  # two dtypes, as an engine in bf16 beside fp32 norms
    m.register_parameter("big", torch.nn.Parameter(torch.zeros(512, 600)))  # 1.2 MB: a transfer of its own
    m.register_parameter("tied", m[0].weight)  # a second name for one parameter, as tied embeddings
    m[2].register_parameter("alias", m[2].weight)  # another, in its first name's bucket: its slot copied from there
    return m


def _trainer() -> torch.nn.Module:
    torch.manual_seed(0)
    m = _module()
    torch.nn.init.normal_(m.big)
    return m


def _sent(m: torch.nn.Module) -> dict:
    return dict(m.state_dict()) | {"tied": m.tied.detach()}  # the trainer's parameters, as full_tensors gives them


def _step(m: torch.nn.Module) -> None:
    with torch.no_grad():  # an optimizer step: every parameter changed where it lives (a tied one once)
        for p in m.parameters():
            p.add_(0.5)


def _model() -> dict:
    """What the receivers hold after the third sync: the trainer's weights after a step."""
    m = _trainer()
    _step(m)
    return _sent(m)


@pytest.mark.parametrize(
    "sent, laid",
    [
        (lambda p: p.detach(), True),  # the parameter's own memory (DDP, one process): laid out in the buffer
        (lambda p: p.detach().clone(), False),  # a copy (FSDP's gathered tensor, LoRA's merge)
        (lambda p: p.detach().to(torch.float64), False),  # a cast to the engines' dtype
    ],
)
def test_the_sender_lays_out_only_the_parameters_it_sends_as_they_are(sent, laid):
    m = torch.nn.Linear(4, 3)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    parts = [sent(p) for p in (m.weight, m.bias)]
    bucket = [Entry(n, tuple(t.shape), t.dtype) for n, t in zip(("weight", "bias"), parts)]
    buf = Landing(m).sent(bucket, parts)
    assert (buf is not None) == laid
    if laid:  # the parameters now live in the buffer, end to end, with their values
        assert m.weight.data_ptr() == buf.data_ptr() and m.bias.data_ptr() == buf.data_ptr() + 12 * 4
    assert all(torch.equal(p, before[n]) for n, p in m.named_parameters())


def _summary(t: torch.Tensor) -> tuple:
    # the bytes themselves: a float sum's rounding depends on how many threads summed it
    return t.dtype, t.shape, hashlib.sha256(t.detach().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def _rank(rank: int, world: int, port: int, out) -> None:
    group = SyncGroup(("127.0.0.1", port), rank, world, torch.device("cpu"), 60)
    if rank == 0:  # the trainer: its small parameters move into the packing buffers on the first sync
        m = _trainer()
        entries = group.agree_layout(layout(_sent(m).items()))
        own = Landing(m)
        group.send(_sent(m).items(), bucket_bytes=2048, own=own)
        group.send(_sent(m).items(), bucket_bytes=2048, own=own)  # the second sends them from there
        _step(m)  # the third, after a step, sends what the step wrote there (the tied slot copied anew)
        sent = group.send(_sent(m).items(), bucket_bytes=2048, own=own)
        packed = [tuple(e.name for e in b) for b in buckets(entries, 2048) if not direct(b)]
        laid = {k for k in packed if own.laid.get(k) is not None and group.staging[k] is own.laid[k]}
        assert laid == set(packed) - {("0.weight",)}  # the tied parameter's second name: it lives in the first's
        assert m[2].bias.data_ptr() == m[2].weight.data_ptr() + 16 * 4
        # every tensor of that bucket found in its buffer: later syncs only copy the alias's slot
        (ties,) = [t for k, (_, t) in group._in_place.items() if "2.alias" in k]
        assert len(ties) == 1
        out.put((rank, sent))
    elif rank == 1:  # an engine's module: every bucket lands in its parameters
        entries = group.agree_layout(None)
        torch.manual_seed(1)
        m = _module()
        landing = Landing(m)
        for _ in range(3):  # the later syncs land in the buffers the first laid out
            assert list(group.receive(landing, bucket_bytes=2048)) == []
        packed = [b for b in buckets(entries, 2048) if not direct(b)]
        assert all(landing.laid[tuple(e.name for e in b)] is not None for b in packed)
        assert m[2].bias.data_ptr() == m[2].weight.data_ptr() + 16 * 4  # laid end to end, in the bucket's order
        assert m.tied is m[0].weight
        out.put((rank, {k: _summary(v) for k, v in m.state_dict().items()} | {"tied": _summary(m.tied)}))
    else:  # no module: the large tensor lands in place, the rest is handed over
        group.agree_layout(None)
        own = {"big": torch.zeros(512, 600)}
        for _ in range(3):
            got = {
                name: t.clone()
                for name, t in group.receive(lambda b: in_place_target(own, b[0]) if direct(b) else None, 2048)
            }
        assert "big" not in got  # landed in place, not handed over
        got["big"] = own["big"]
        out.put((rank, {k: _summary(v) for k, v in got.items()}))


def test_a_gloo_group_carries_every_tensor_to_every_receiver():
    ctx = mp.get_context("spawn")
    out, port, world = ctx.Queue(), kernel_free_port(), 3
    procs = [ctx.Process(target=_rank, args=(r, world, port, out)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(out.get(timeout=120) for _ in range(world))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    sd = _model()
    want = {k: _summary(v) for k, v in sd.items()}
    assert results[1] == want and results[2] == want
    assert results[0] == sum(v.numel() * v.element_size() for v in sd.values())


class _NcclLike:
    """A process group with NCCL's wait: Work.wait() only orders the current stream (the host blocks only under
    TORCH_NCCL_BLOCKING_WAIT), so a transfer is done on the host's clock only once the device is synchronized."""

    def __init__(self):
        self.queued, self.done, self.waited = [], set(), set()

    def broadcast(self, tensors, opts):
        i = len(self.queued)
        self.queued.append(i)
        return type("Work", (), {"wait": lambda _: self.waited.add(i)})()

    def synchronize(self, device=None):
        self.done.update(self.waited)


@pytest.mark.process  # a one-rank Gloo group, whose process group the stand-in replaces
@pytest.mark.parametrize("side", ["send", "receive"])
def test_a_sync_returns_with_its_transfers_done_on_the_hosts_clock(monkeypatch, side):
    """What timing_s/sync_rollout_weights, its bandwidth and the watchdog's sync_rollout_weights phase measure: the
    transfer itself, not its queueing, on both sides."""
    from rlrig.trainer.rollout import weight_sync

    group = SyncGroup(("127.0.0.1", kernel_free_port()), 0, 1, torch.device("cpu"), 60)
    group.pg = pg = _NcclLike()
    monkeypatch.setattr(weight_sync, "settle", lambda device: pg.synchronize(device))
    tensors = [("a", torch.ones(3)), ("big", torch.zeros(2**18)), ("b", torch.ones(2))]
    group.entries = layout(tensors)
    if side == "send":
        group.send(iter(tensors))
    else:
        assert [name for name, _ in group.receive()] == ["a", "big", "b"]
    assert pg.queued == [0, 1, 2] and pg.done == {0, 1, 2}


def test_settle_synchronizes_the_device_only_on_cuda(monkeypatch):
    from rlrig.trainer.rollout import weight_sync

    synced = []
    monkeypatch.setattr(weight_sync.torch.cuda, "synchronize", synced.append)
    weight_sync.settle(torch.device("cpu"))
    weight_sync.settle(torch.device("cuda", 1))
    assert synced == [torch.device("cuda", 1)]
