"""The hf engine with and without rollout.enable_prefix_caching, in one run: GRPO's n samples of a prompt
sharing that prompt's prefill (as vLLM's prefix cache shares it) against each sample prefilling it.

The model: bench/rollout.py's randomly initialised Qwen2 of 8 layers x 512, built offline. Prompts of
--prompt-len random tokens, --n samples each, --max-new new tokens at temperature 1 (the untrained model
rarely stops early, so every run decodes about the same tokens); generation seconds are the median of
--reps, the two settings interleaved. The samples are the same either way (tests/unit/trainer/rollout/test_rollout.py).

    python bench/prefix_caching.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(Path(__file__).parent))
    from rollout import bench_model

    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.rollout.engines import EngineContext
    from rlrig.trainer.rollout.engines.hf_engine import HFRollout

    torch.set_num_threads(2)
    path = bench_model()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, len(tok), (a.prompts, a.prompt_len), generator=g).tolist()
    engines = {
        on: HFRollout(
            EngineContext(model, tok, RolloutConfig(enable_prefix_caching=on), a.prompt_len, a.max_new, path, "cpu", 0)
        )
        for on in (False, True)
    }
    secs: dict[bool, list[float]] = {False: [], True: []}
    for on in (False, True):
        engines[on].generate(prompts[:2], a.n)  # warm-up
    for _ in range(a.reps):
        for on in (False, True):
            t0 = time.perf_counter()
            engines[on].generate(prompts, a.n)
            secs[on].append(time.perf_counter() - t0)
    off, on = statistics.median(secs[False]), statistics.median(secs[True])
    print(f"{a.prompts} prompts of {a.prompt_len} tokens x {a.n} samples, {a.max_new} new tokens; median of {a.reps}")
    print(f"{'enable_prefix_caching':>22} {'s/batch':>8}")
    print(f"{'False':>22} {off:8.3f}\n{'True':>22} {on:8.3f}")
    print(f"prefix sharing: generation {off / on:.2f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
