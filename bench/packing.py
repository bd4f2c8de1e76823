"""Padding-free forwards (`actor_rollout_ref.model.use_remove_padding=True`) vs the padded layout:
the actor update's forward and backward over one rollout batch, in one run, same model and tokens.

The batch is what sampling produces: left-padded prompts, then responses that stop at EOS after
lengths spread from 1 to --response tokens (uniform), padded to the longest. The model is a randomly
initialised Qwen2 (sdpa attention), float32 as the trainer uses. Last line: packed/padded ratio.

    python bench/packing.py                       # CPU, a small model
    python bench/packing.py --device cuda --layers 12 --hidden 1024 --batch 128 --response 1024
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--response", type=int, default=256)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args(argv)
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs

    torch.manual_seed(0)
    dev = torch.device(args.device)
    cfg = Qwen2Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=max(1, args.hidden // 64),
        num_key_value_heads=max(1, args.hidden // 64),
        max_position_embeddings=args.prompt + args.response,
        attn_implementation="sdpa",
    )
    model = Qwen2ForCausalLM(cfg).to(dev)
    B, P, R = args.batch, args.prompt, args.response
    prompt_lens = torch.randint(P // 2, P + 1, (B,))
    resp_lens = torch.randint(1, R + 1, (B,))
    R = int(resp_lens.max())  # as the engines pad: to the longest response in the batch
    ids = torch.randint(0, args.vocab, (B, P + R))
    cols = torch.arange(P + R)[None]
    mask = ((cols >= P - prompt_lens[:, None]) & (cols < P + resp_lens[:, None])).long()
    ids, mask = ids.masked_fill(mask == 0, 0).to(dev), mask.to(dev)
    real = int(mask.sum())

    def once(packed: bool) -> float:
        model.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        logp, _ = token_logprobs(model, ids, mask, P, ForwardOptions(remove_padding=packed))
        logp.sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    for packed in (False, True):  # warm-up: kernels, allocator
        once(packed)
    times = {False: [], True: []}
    for _ in range(args.reps):  # interleaved, so drift hits both
        for packed in (False, True):
            times[packed].append(once(packed))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"model {args.layers}x{args.hidden} on {args.device}; batch {B} x (prompt <= {P} + response 1..{R}); "
        f"real tokens {real} of {B * (P + R)} ({real / (B * (P + R)):.0%})",
        file=sys.stderr,
    )
    for packed, name in ((False, "padded"), (True, "packed")):
        print(f"{name:>7}: {med[packed]:.3f} s forward+backward, {real / med[packed]:9.0f} real tokens/s")
    print(f"packed/padded: {med[False] / med[True]:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
