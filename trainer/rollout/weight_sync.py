"""The actor's weights from the training pool into the engines of a rollout pool of their own
(actor_rollout_ref.hybrid_engine=False): one process group spanning training rank 0 (its rank 0) and every rollout
worker, apart from the training workers' own group, over which rank 0 broadcasts the weights in buckets.

A tensor of DIRECT_BYTES or more travels alone, straight from the trainer's tensor and, where the engine can take
it in place (the hf engine's own parameters), straight into the engine's: no copy on either side, which on CPU
would cost as much as the transfer itself. Smaller ones (biases, norms) share buckets, one flat buffer of one dtype
up to `bucket_bytes`: one collective per bucket instead of one per tensor. Where a module's parameters can live in
a bucket's buffer (Landing), the first sync moves them there, on both sides, and later ones send and take the
buffer with no packing. Two transfers are in flight at a time, so preparing one overlaps the other. Both sides cut
the same buckets from the same list of (name, shape, dtype), which rank 0 sends once when the group forms. As
verl's one-step recipe and vLLM's weight-transfer examples: NCCL on GPUs, Gloo on CPU, a group made from a TCP store
rather than torch's default group, which each side already has.

On GPUs a sync returns only once its last transfer is done on the host's clock (`settle`): NCCL's Work.wait() makes
the current stream wait and blocks the host only under TORCH_NCCL_BLOCKING_WAIT, so without it a sync would return
with its bytes still queued, its seconds and bandwidth those of queueing, and a stalled broadcast would stall the
phase after it, named as that phase by the watchdog. Gloo's wait blocks the host already.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import pickle
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

BUCKET_BYTES = 512 * 2**20  # verl's checkpoint engine defaults to 4 GiB buffers on GPU; half a GiB keeps CPU runs lean
DIRECT_BYTES = 2**20  # a tensor this large is a transfer of its own: packing it would only add a copy
IN_FLIGHT = 2


# NCCL's cuMem allocation set alike on every member of the sync's communicator: mixed, same-node peer transfers fail
# ("transport/p2p.cc: Cuda failure 'invalid argument'"), and SGLang's Engine turns it off in its worker's process
CUMEM = "NCCL_CUMEM_ENABLE"


def env_vars(cfg) -> dict[str, str]:
    """The environment every worker of the run gets (Ray's runtime_env, under the user's env_vars) where the rollout
    engines have a pool of their own (hybrid_engine=False), whose weight sync is one NCCL communicator across
    training rank 0 and the engines' workers: NCCL_CUMEM_ENABLE=0, as verl's runtime env sets it for every worker.
    Whatever the launching shell holds would not do: a cluster the run joins does not inherit it, and 1 is what
    SGLang's processes differ from."""
    return {} if cfg.actor_rollout_ref.hybrid_engine else {CUMEM: "0"}


def settle(device: torch.device) -> None:
    """The host waits until the work queued on `device` (the sync's transfers, NCCL's stream among it) is done;
    nothing on CPU, where Gloo's wait has blocked already."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass(frozen=True)
class Entry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def direct(bucket: list[Entry]) -> bool:
    return len(bucket) == 1 and bucket[0].nbytes >= DIRECT_BYTES


def buckets(entries: list[Entry], bucket_bytes: int = BUCKET_BYTES) -> list[list[Entry]]:
    """A tensor of DIRECT_BYTES or more alone; the others in consecutive runs of one dtype, at most bucket_bytes."""
    out: list[list[Entry]] = []
    size, packing = 0, False
    for e in entries:
        if e.nbytes >= DIRECT_BYTES:
            out.append([e])
            packing = False
            continue
        if not packing or out[-1][0].dtype != e.dtype or size + e.nbytes > bucket_bytes:
            out.append([])
            size, packing = 0, True
        out[-1].append(e)
        size += e.nbytes
    return out


def in_place_target(own: dict[str, torch.Tensor], e: Entry) -> torch.Tensor | None:
    """The engine's own tensor for `e` if a transfer can land in it as it is (same shape and dtype, contiguous)."""
    t = own.get(e.name)
    if t is None or tuple(t.shape) != e.shape or t.dtype != e.dtype or not t.is_contiguous():
        return None
    return t


class Landing:
    """Where a module's incoming transfers land with no copy: a tensor of DIRECT_BYTES or more in its own parameter;
    a packed bucket in one buffer, laid out as the bucket is, that the bucket's parameters were moved into when it
    first arrived. A tied parameter's second slot in such a buffer goes unused (the same bytes arrive in it). A bucket
    with anything the module does not hold as a parameter of that shape and dtype (a buffer, a LoRA layout, another
    name) gets None: it lands in a buffer of the sync's own and is copied out.

    On the sending side (`sent`) the same layout spares rank 0 the packing: the trainer's parameters live in the
    bucket's buffer, so what it sends is already there."""

    def __init__(self, module: torch.nn.Module):
        self.params = dict(module.named_parameters(remove_duplicate=False))
        self.laid: dict[tuple[str, ...], torch.Tensor | None] = {}
        self.placed: set[int] = set()  # parameters already moved into a bucket's buffer (by id)
        self._seen: dict[int, tuple[list[Entry], torch.Tensor | None]] = {}

    def sent(self, bucket: list[Entry], parts: list[torch.Tensor]) -> torch.Tensor | None:
        """Rank 0: a buffer for the bucket with the module's parameters moved into it, where every tensor sent is
        a parameter's own memory (a plain tensor, as under DDP or in one process); None where any is not (FSDP's
        gathered tensors, a cast to the engines' dtype, LoRA's merge): those are packed into a buffer of the sync's
        own, never into memory a parameter lives in."""
        for e, t in zip(bucket, parts):
            p = self.params.get(e.name)
            if p is None or type(p.data) is not torch.Tensor or not _same_memory(p.data, t):
                return None
        return self(bucket)

    def __call__(self, bucket: list[Entry]) -> torch.Tensor | None:
        seen = self._seen.get(id(bucket))  # the same list as the last sync's (the group cuts its buckets once)
        if seen is not None and seen[0] is bucket:
            return seen[1]
        if direct(bucket):
            p = self.params.get(bucket[0].name)
            return in_place_target({bucket[0].name: p.data}, bucket[0]) if p is not None else None
        key = tuple(e.name for e in bucket)
        if key not in self.laid:
            self.laid[key] = self._lay_out(bucket)
        self._seen[id(bucket)] = (bucket, self.laid[key])  # the list kept, so its id names no other
        return self.laid[key]

    @torch.no_grad()
    def _lay_out(self, bucket: list[Entry]) -> torch.Tensor | None:
        ps = [self.params.get(e.name) for e in bucket]
        if any(p is None or tuple(p.shape) != e.shape or p.dtype != e.dtype for p, e in zip(ps, bucket)):
            return None
        flat = torch.empty(sum(e.numel for e in bucket), dtype=bucket[0].dtype, device=ps[0].device)
        at = 0
        for p, e in zip(ps, bucket):
            if id(p) not in self.placed:
                slot = flat[at : at + e.numel].view(e.shape)
                slot.copy_(p.data)
                p.data = slot
                self.placed.add(id(p))
            at += e.numel
        return flat


class SyncGroup:
    """This process's place in the weight-sync group: rank 0 sends, the others receive."""

    def __init__(self, master: tuple[str, int], rank: int, world: int, device: torch.device, timeout_s: float):
        store = dist.TCPStore(master[0], master[1], world, is_master=rank == 0, timeout=timedelta(seconds=timeout_s))
        self.rank, self.world, self.device = rank, world, device
        if device.type == "cuda":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timedelta(seconds=timeout_s)  # noqa: SLF001 (torch's only way to set it here)
            self.pg = dist.ProcessGroupNCCL(store, rank, world, opts)
        else:
            self.pg = dist.ProcessGroupGloo(store, rank, world, timedelta(seconds=timeout_s))
        self._from_rank0 = dist.BroadcastOptions()
        self._from_rank0.rootRank = 0
        self.entries: list[Entry] | None = None
        self._cut: tuple[int, list] | None = None  # _buckets'
        # rank 0's packing buffer of each bucket, kept: a fresh one would be paged in on every sync
        self.staging: dict[tuple[str, ...], torch.Tensor] = {}
        self._slots: dict[tuple[str, ...], list[tuple[int, int, int]]] = {}  # each staging buffer's, as _slots gives
        # a bucket whose tensors were all in its buffer, as rank 0 found them last: their addresses, and the slots of a
        # tied parameter's second name, each copied from the first's (_in_place)
        self._in_place: dict[tuple[str, ...], tuple[list[int], list[Callable[[], object]]]] = {}

    def _broadcast(self, t: torch.Tensor) -> None:
        self._start(t).wait()

    def _broadcast_bytes(self, data: bytes | None) -> bytes:
        n = torch.tensor([len(data) if data is not None else 0], dtype=torch.long, device=self.device)
        self._broadcast(n)
        buf = torch.empty(int(n.item()), dtype=torch.uint8, device=self.device)
        if data is not None:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self._broadcast(buf)
        return bytes(buf.cpu().numpy())

    def agree_layout(self, entries: list[Entry] | None) -> list[Entry]:
        """Rank 0's list of tensors, on every rank (once, when the group forms)."""
        self.entries = pickle.loads(self._broadcast_bytes(pickle.dumps(entries) if self.rank == 0 else None))
        self._cut = None
        return self.entries

    def _start(self, t: torch.Tensor):
        return self.pg.broadcast([t], self._from_rank0)

    def send(
        self,
        tensors: Iterable[tuple[str, torch.Tensor]],
        bucket_bytes: int = BUCKET_BYTES,
        own: Landing | None = None,
    ) -> int:
        """Rank 0: the tensors, in the agreed order; returns the bytes sent. `own`: the module they come from, whose
        parameters may then be laid out in the packing buffers (Landing.sent)."""
        it, sent = iter(tensors), 0

        def transfers() -> Iterator[torch.Tensor]:
            nonlocal sent
            for key, bucket in self._buckets(bucket_bytes):
                got = tuple(itertools.islice(it, len(bucket)))  # a small model's sync is mostly Python: kept in C here
                names, parts = tuple(zip(*got)) or ((), ())
                if names != key:
                    raise RuntimeError(f"weight sync: expected {list(key)}, got {list(names)}")
                out = (
                    parts[0].detach().to(self.device).contiguous()
                    if direct(bucket)
                    else self._packed(key, bucket, parts, own)
                )
                sent += out.numel() * out.element_size()
                yield out

        self.broadcast_paced(transfers())
        return sent

    def _packed(
        self, key: tuple[str, ...], bucket: list[Entry], parts: Sequence[torch.Tensor], own: Landing | None
    ) -> torch.Tensor:
        """The bucket's buffer holding `parts`, copying only those not already in their place in it."""
        out = self.staging.get(key)
        if out is None:
            laid = own.sent(bucket, parts) if own is not None else None
            if laid is None:
                laid = torch.empty(sum(e.numel for e in bucket), dtype=bucket[0].dtype, device=self.device)
            out = self.staging[key] = laid
            self._slots[key] = _slots(bucket, out)
        # in place: a part that is a view of its slot, as a parameter laid out there gives it. Checked by address
        # (with unified addressing no host and device memory share one), since a small model's sync is mostly this:
        # as the last sync found them, in as few Python steps as there can be
        known = self._in_place.get(key)
        if (
            known is not None
            and list(map(torch.Tensor.data_ptr, parts)) == known[0]
            and all(map(torch.Tensor.is_contiguous, parts))
        ):
            for copy in known[1]:
                copy()
            return out
        return self._pack(key, parts, out)

    @torch.no_grad()  # the trainer's own parameters among them: packing them builds no graph
    def _pack(self, key: tuple[str, ...], parts: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """The parts not in their slots copied there; where all of them are in the buffer, remembered as such."""
        slots = self._slots[key]
        away = [(at, n, t) for (at, n, ptr), t in zip(slots, parts) if t.data_ptr() != ptr or not t.is_contiguous()]
        if len(away) == len(parts):
            torch.cat([t.reshape(-1).to(self.device) for _, _, t in away], out=out)  # one copy, not one per tensor
            return out
        for at, n, t in away:  # a tied parameter's second slot, or a tensor that moved
            out[at : at + n].copy_(t.reshape(-1))
        sources = [_view_at(out, slots, t) for _, _, t in away]
        if all(source is not None for source in sources):  # every tensor is in the buffer: next time, only the ties
            ties = [_copier(out[at : at + n], source) for (at, n, _), source in zip(away, sources)]
            self._in_place[key] = ([t.data_ptr() for t in parts], ties)
        else:
            self._in_place.pop(key, None)
        return out

    def _buckets(self, bucket_bytes: int) -> list[tuple[tuple[str, ...], list[Entry]]]:
        """The agreed entries' buckets, each with its names, cut once per size: both sides walk them on every sync."""
        if self._cut is None or self._cut[0] != bucket_bytes:
            self._cut = (bucket_bytes, [(tuple(e.name for e in b), b) for b in buckets(self.entries, bucket_bytes)])
        return self._cut[1]

    def broadcast_paced(self, tensors: Iterable[torch.Tensor]) -> None:
        """Each tensor from rank 0, IN_FLIGHT transfers at a time: the next one is prepared while the last is in
        flight. Returns with every transfer done (settle)."""
        flying: deque = deque()
        for t in tensors:
            while len(flying) >= IN_FLIGHT:
                flying.popleft()[0].wait()
            flying.append((self._start(t), t))  # the tensor kept alive until its transfer is done
        while flying:
            flying.popleft()[0].wait()
        settle(self.device)

    def receive(
        self,
        in_place: Callable[[list[Entry]], torch.Tensor | None] = lambda bucket: None,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> Iterator[tuple[str, torch.Tensor]]:
        """The other ranks: (name, tensor) for each tensor not landed in place (`in_place(bucket)` gives the engine's
        own memory for a whole bucket where it can take it as it is, such as Landing's); views of their transfer's
        buffer. Ends with every transfer, and what the engine queued on the device for the tensors it was given,
        done (settle)."""
        flying: deque = deque()

        def land():
            work, bucket, buf, landed = flying.popleft()
            work.wait()
            if landed:
                return
            at = 0
            for e in bucket:
                yield e.name, buf[at : at + e.numel].view(e.shape)
                at += e.numel

        for _, bucket in self._buckets(bucket_bytes):
            target = in_place(bucket)
            buf = (
                target
                if target is not None
                else torch.empty(sum(e.numel for e in bucket), dtype=bucket[0].dtype, device=self.device)
            )
            flying.append((self._start(buf), bucket, buf, target is not None))
            if len(flying) >= IN_FLIGHT:
                yield from land()
        while flying:
            yield from land()
        settle(self.device)


def _slots(bucket: list[Entry], buf: torch.Tensor) -> list[tuple[int, int, int]]:
    """(offset, numel, address) of each entry's slot in the bucket's buffer."""
    at, out = 0, []
    for e in bucket:
        out.append((at, e.numel, buf.data_ptr() + at * buf.element_size()))
        at += e.numel
    return out


def _copier(slot: torch.Tensor, source: torch.Tensor) -> Callable[[], object]:
    """A copy of `source` into `slot`, both in one kept buffer: in host memory a bare memmove, which costs a small
    model's sync a tenth of what torch's copy_ does (its dispatch, not its bytes)."""
    if slot.device.type == "cpu":
        return functools.partial(ctypes.memmove, slot.data_ptr(), source.data_ptr(), slot.numel() * slot.element_size())
    return functools.partial(slot.copy_, source)


def _view_at(buf: torch.Tensor, slots: list[tuple[int, int, int]], t: torch.Tensor) -> torch.Tensor | None:
    """The slot of `buf` that `t` is (a tied parameter's first name's), flat; None where it is no slot."""
    for at, n, ptr in slots:
        if ptr == t.data_ptr() and n == t.numel() and t.is_contiguous() and t.dtype == buf.dtype:
            return buf[at : at + n]
    return None


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """`b` is `a` itself: the same memory, shape and layout (a view of the same bytes)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.numel() == b.numel()
        and b.is_contiguous()
        and a.data_ptr() == b.data_ptr()
    )


def layout(tensors: Iterable[tuple[str, torch.Tensor]]) -> list[Entry]:
    return [Entry(name, tuple(t.shape), t.dtype) for name, t in tensors]
