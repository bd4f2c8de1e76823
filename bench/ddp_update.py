"""What data parallelism costs bench/ppo_step.py's update: the same update in one process against two ranks.

The work of ppo_step.py's update phase: the embedded model, --batch prompts x --n samples of --prompt-len +
--response-len tokens, each prompt computed once for its n samples (use_prefix_grouper), the clipped surrogate plus
a k3 KL loss, gradient clipping and one AdamW step. Three ways, on the same CPU cores:
- one process: the whole batch, torch on all cores (ppo_step.py's floor);
- two ranks, no exchange: two processes of one thread, each on half the batch, each stepping on its own gradients
  (no collective: what two workers cost without data parallelism's one exchange);
- two ranks, DDP: the same two, the module wrapped by rlrig's own `parallel.wrap` (strategy=ddp, Gloo), which
  all-reduces the gradients in the backward: rlrig's layout in `rlrig train`'s default and in ppo_step.py.
Per run --steps updates, the first --warmup dropped, the median of the rest; the runs interleaved --repeats times
and the median run shown. "DDP / one process" is the part of ppo_step.py's update_actor ratio that the layout
costs; "DDP - no exchange" is the gradient all-reduce and the wait at it.

    python bench/ddp_update.py
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

LR, KL_COEF = 5e-4, 0.001
CHILD_TIMEOUT_S = 300  # a run takes seconds; one past this is stuck (a rank waiting for a peer that never came)


def batch(a, prompts: int, vocab: int):
    """(input_ids, attention_mask) of `prompts` prompts x n samples: each prompt's n rows share its tokens."""
    import torch

    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, vocab, (prompts, a.prompt_len), generator=g).repeat_interleave(a.n, 0)
    response = torch.randint(3, vocab, (prompts * a.n, a.response_len), generator=g)
    ids = torch.cat([prompt, response], 1)
    return ids, torch.ones_like(ids)


def updates(a, module, train, prompts: int) -> list[float]:
    """Seconds of each of a.steps updates of `module` through `train` (the module itself or its DDP wrapper)."""
    import torch

    from rlrig.trainer.algos import core_algos as algos
    from rlrig.trainer.algos.policy_losses.vanilla import clipped_surrogate
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

    ids, mask = batch(a, prompts, module.config.vocab_size)
    adv = torch.randn(ids.shape[0], a.response_len, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = token_logprobs(module, ids, mask, a.prompt_len, ForwardOptions(share_prompts=True))[0]
    rmask = torch.ones_like(ref)
    opt = torch.optim.AdamW(module.parameters(), lr=LR, weight_decay=0.01)
    opts = ForwardOptions(with_entropy=True, entropy_grad=False, share_prompts=True)
    times = []
    for _ in range(a.steps):
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # both ranks start together, as they do after a step's earlier phases
        t0 = time.perf_counter()
        opt.zero_grad()
        logp, _ = token_logprobs(train, ids, mask, a.prompt_len, opts)
        pg, _, _ = clipped_surrogate(logp.detach(), logp, adv, rmask, 0.2, 0.2, 3.0, "token-mean")
        kl = algos.agg_loss(algos.kl_penalty(logp, ref, "low_var_kl"), rmask, "token-mean")
        (pg + KL_COEF * kl).backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    return times


def run_one_process(a) -> list[float]:
    import torch
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    return updates(a, module, module, a.batch)


def run_rank(a, rank: int, port: int, exchange: bool) -> list[float]:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        return rank_updates(a, exchange)
    finally:
        # a DDP wrapper freed after its group was destroyed can deadlock in the group's destructor (torch 2.13): the
        # models, gone with rank_updates' frame, are collected first, as in the training worker's shutdown
        gc.collect()
        dist.destroy_process_group()


def rank_updates(a, exchange: bool) -> list[float]:
    """This rank's update times on its half of the batch, through rlrig's DDP wrapper or the module itself."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.model import parallel

    torch.manual_seed(0)
    module = AutoModelForCausalLM.from_pretrained(ensure_tiny_model(), dtype=torch.float32)
    precision = SimpleNamespace(strategy="ddp", reduce_dtype=torch.float32)
    train = parallel.wrap(module, torch.device("cpu"), precision, None) if exchange else module
    return updates(a, module, train, a.batch // 2)


def child(a, method: str) -> list[float]:
    """`method` in processes of its own (thread settings do not leak): one, or two ranks (rank 0's times). A rank
    that fails ends the others, which would otherwise wait for it in a collective."""
    common = [f"--steps={a.steps}", f"--batch={a.batch}", f"--n={a.n}"]
    common += [f"--prompt-len={a.prompt_len}", f"--response-len={a.response_len}"]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    if method == "one process":
        cmds = [[sys.executable, __file__, "--only", "one", *common]]
    else:
        from rlrig.entrypoint.cluster.ports import kernel_free_port

        port, flag = kernel_free_port("127.0.0.1"), "ddp" if method == "two ranks, DDP" else "local"
        cmds = [[sys.executable, __file__, "--only", flag, f"--rank={r}", f"--port={port}", *common] for r in (0, 1)]
    with tempfile.TemporaryDirectory(prefix="rlrig-bench-ddp-") as d:
        outs = [(Path(d, f"{i}.out"), Path(d, f"{i}.err")) for i in range(len(cmds))]
        procs = [
            subprocess.Popen(c, stdout=o.open("w"), stderr=e.open("w"), text=True, env=env)
            for c, (o, e) in zip(cmds, outs)
        ]
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for p, (_, e) in zip(procs, outs):
            if p.returncode != 0:
                raise SystemExit(f"{method} failed (exit {p.returncode}):\n{e.read_text()[-3000:]}")
        return json.loads(outs[0][0].read_text().strip().splitlines()[-1])


METHODS = ("one process", "two ranks, no exchange", "two ranks, DDP")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="prompts an update (split between the two ranks)")
    ap.add_argument("--n", type=int, default=8, help="samples a prompt")
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--response-len", type=int, default=8)
    ap.add_argument("--only", choices=["one", "local", "ddp"], help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.batch % 2:
        ap.error("--batch: an even number of prompts, half to each rank")
    if a.only:
        times = run_one_process(a) if a.only == "one" else run_rank(a, a.rank, a.port, a.only == "ddp")
        print(json.dumps(times))
        return 0
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model

    ensure_tiny_model()
    runs: dict[str, list[float]] = {m: [] for m in METHODS}
    for rep in range(a.repeats):  # interleaved, so a slow spell of the machine hits every method alike
        for m in METHODS:
            runs[m].append(statistics.median(child(a, m)[a.warmup :]))
            print(f"  run {rep + 1} {m:>22}: {runs[m][-1] * 1e3:.1f} ms", file=sys.stderr, flush=True)
    s = {m: statistics.median(r) for m, r in runs.items()}
    print(
        f"\n{a.batch} prompts x {a.n} samples, {a.prompt_len} + {a.response_len} tokens; per run the median of "
        f"updates {a.warmup + 1}..{a.steps}, then the median of {a.repeats} runs"
    )
    for m in METHODS:
        print(f"{m:>22} {s[m] * 1e3:8.1f} ms")
    one, local, ddp = (s[m] for m in METHODS)
    print(
        f"DDP / one process {ddp / one:.2f}x; no exchange / one process {local / one:.2f}x; "
        f"DDP - no exchange {(ddp - local) * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
