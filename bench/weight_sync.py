"""The rollout pool's weight sync (rollout/weight_sync.py) against a raw broadcast of the same bytes over the same
group: training rank 0 sends a model's weights and the receiver takes them as the hf engine does (rollout/weight_sync.py
Landing: every transfer lands in the model's own parameters, with no copy; the sender's small parameters live in
its packing buffers the same way); the raw broadcast sends one flat buffer holding the same bytes and copies nothing.
The tensors are the trainer's (model/parallel.full_tensors).
Two models: the embedded tiny one and a random one shaped as Qwen2.5-0.5B (494M parameters, fp32 on CPU).

Two processes on this machine over Gloo (loopback); the median of --runs pushes each (--runs-small at the embedded
model), the sync and the raw broadcast taking turns, after a first sync that lays both sides' parameters out in the
sync's buffers. The tensors are listed once, as the trainer holds them: listing them (a state_dict) is the trainer's
cost whatever carries them. Its last line:

  weight sync / raw broadcast: 1.09x at 0.5B; 1.13x at the embedded model (0.6 ms against 0.5)

    python bench/weight_sync.py             # about a minute here
    python bench/weight_sync.py --breakdown # and where the difference goes at 0.5B
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time

import torch

from rlrig.entrypoint.cluster.ports import kernel_free_port
from rlrig.trainer.model.parallel import full_tensors
from rlrig.trainer.rollout.weight_sync import Landing, SyncGroup, buckets, layout

QWEN_05B = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    tie_word_embeddings=True,
)


def build(name: str):
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    if name == "embedded":
        from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

        return AutoModelForCausalLM.from_pretrained(ensure_tiny_model())
    return Qwen2ForCausalLM(Qwen2Config(**QWEN_05B))


def written(nbytes: int) -> torch.Tensor:
    """A receiving buffer whose pages exist (torch.empty's and torch.zeros' are mapped on first write)."""
    return torch.empty(nbytes, dtype=torch.uint8).fill_(1)


def side(rank: int, port: int, name: str, runs: int, breakdown: bool, out) -> None:
    torch.set_num_threads(1)
    model = build(name).requires_grad_(False)
    group = SyncGroup(("127.0.0.1", port), rank, 2, torch.device("cpu"), 600)
    sent = list(full_tensors(model))  # what training rank 0 sends
    group.agree_layout(layout(sent) if rank == 0 else None)
    landing = Landing(model)  # as the trainer sends them and the hf engine takes them
    total = sum(e.nbytes for e in group.entries)
    # the raw broadcast sends the weights' own bytes. A buffer never written would be read from the kernel's shared
    # zero page (every page the same 4 KiB, always in cache) instead of memory: at 0.5B that sends about 0.2 s faster
    flat = written(total) if rank else torch.cat([t.contiguous().reshape(-1).view(torch.uint8) for _, t in sent])

    def timed(pushes: dict) -> dict[str, float]:
        """The median seconds of each push over --runs, both sides starting each together. The pushes take turns
        within every run, so a change in what else this machine is doing weighs on them alike."""
        took = {what: [] for what in pushes}
        for _ in range(runs):
            for what, push in pushes.items():
                group._broadcast(torch.zeros(1))
                t0 = time.perf_counter()
                push()
                took[what].append(time.perf_counter() - t0)
        return {what: statistics.median(t) for what, t in took.items()}

    def sync() -> None:
        if rank == 0:
            group.send(sent, own=landing)
        else:
            with torch.no_grad():  # in place where the model can take them, copied otherwise
                own = None
                for key, t in group.receive(landing):
                    own = own or model.state_dict()
                    own[key].copy_(t)

    def in_pieces(pieces: list[torch.Tensor]):
        return lambda: group.broadcast_paced(pieces)  # the sync's own pacing, without its packing

    # the first sync lays out the parameters on both sides (Landing); the trainer lists its tensors anew for every
    # sync (full_tensors: a state_dict, about 0.2 ms at the embedded model, whatever then carries them)
    sync()
    sent = list(full_tensors(model))
    pushes = {"sync": sync, "raw": lambda: group._broadcast(flat)}
    if breakdown:  # where the difference goes: the sync's own transfers without any copy, then fewer, larger ones
        sizes = [sum(e.nbytes for e in b) for b in buckets(group.entries)]
        own_buffers = [written(n) for n in sizes] if rank else [p.clone() for p in flat.split(sizes)]
        pushes[f"{len(own_buffers)} transfers, no copies"] = in_pieces(own_buffers)
        for mib in (64, 256):
            pushes[f"{mib} MiB pieces of one buffer"] = in_pieces(list(flat.split(mib << 20)))
    got = timed(pushes)
    if rank == 1:
        out.put((total, got))


def measure(name: str, runs: int, breakdown: bool = False) -> tuple[int, dict[str, float]]:
    ctx = mp.get_context("spawn")
    out, port = ctx.Queue(), kernel_free_port()
    procs = [ctx.Process(target=side, args=(r, port, name, runs, breakdown, out)) for r in range(2)]
    for p in procs:
        p.start()
    got = out.get(timeout=1800)
    for p in procs:
        p.join(60)
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=9, help="pushes timed at 0.5B (the median is reported)")
    ap.add_argument(
        "--runs-small", type=int, default=1000, help="pushes timed at the embedded model (a millisecond each)"
    )
    ap.add_argument(
        "--breakdown",
        action="store_true",
        help="at 0.5B also time the sync's transfers without copies and the raw buffer in pieces",
    )
    args = ap.parse_args(argv)
    got = {}
    for name in ("embedded", "qwen2.5-0.5b-shaped"):
        runs = args.runs_small if name == "embedded" else args.runs
        total, t = got[name] = measure(name, runs, args.breakdown and name != "embedded")
        sizes = f"{total / 2**20:.1f} MiB, weight sync {t['sync']:.4f} s, raw broadcast {t['raw']:.4f} s"
        print(f"{name}: {sizes}", flush=True)
        for what, seconds in t.items():
            if what not in ("sync", "raw"):
                print(f"  {what}: {seconds:.4f} s, {seconds / t['raw']:.2f}x the raw broadcast", flush=True)
    (_, big), (_, small) = got["qwen2.5-0.5b-shaped"], got["embedded"]
    print(
        f"weight sync / raw broadcast: {big['sync'] / big['raw']:.2f}x at 0.5B; "
        f"{small['sync'] / small['raw']:.2f}x at the embedded model "
        f"({small['sync'] * 1e3:.1f} ms against {small['raw'] * 1e3:.1f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
