"""Peak memory of the training worker for one PPO step, on CPU (runs anywhere, in seconds):

1. a model with a 152k vocabulary (Qwen's), where the logits are the step's largest tensors: every
   pass over the whole batch at once vs micro batches of 8 (log-prob, reference and update passes).
   Target: micro-batched peak at most 0.6x the whole-batch peak.
2. a 12-layer model: gradient checkpointing off vs on. Target: at most 0.7x.
3. "log-prob + entropy": the log-probs and entropy of 8192 response tokens from bf16 logits at a 152k
   vocabulary (a 7B model's micro batch of 16 x 512), rlrig's pass (model/chunked_logprobs.py) against the
   plain formulas it replaced (an fp32 copy, logsumexp and a full softmax) on the same input, without
   gradients, as in the old-log-prob and reference passes. The peak here is what the pass adds to the
   process (its high-water mark minus the resident size with the logits already there).
   Target: at most 0.35x. Beside it, the same with a backward pass over 2048 tokens (the update's case).
4. "head": the same 2048 tokens with their backward pass from the output head's input (bf16 hidden states of width
   64 and the head's weight): the plain head's logits then rlrig's chunked pass, against the fused head
   (model.use_fused_kernels, model/fused_logprobs.py), which never makes the logits. Reported.

Each configuration runs in a fresh process (the worker as the Ray actor runs it, one rank, Gloo);
the peak is the process's resident-set high-water mark over the step alone (reset through
/proc/self/clear_refs before it), so model loading does not count; the process's resident memory
before the step is printed beside it.

    python bench/memory.py
"""

from __future__ import annotations

import json
import subprocess
import sys

WIDE = dict(
    vocab_size=151936,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    max_position_embeddings=512,
)
DEEP = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=12,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=512,
)
COMMON = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.name=hf",
    "trainer.device=cpu",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "data.shuffle=False",
]
RUNS = {
    "vocab 152k, whole batch": (
        WIDE,
        [
            *COMMON,
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=48",
        ],
    ),
    "vocab 152k, micro batches of 8": (
        WIDE,
        [
            *COMMON,
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "data.max_response_length=48",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
        ],
    ),
    "12 layers, no checkpointing": (
        DEEP,
        [
            *COMMON,
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "data.max_response_length=128",
        ],
    ),
    "12 layers, gradient checkpointing": (
        DEEP,
        [
            *COMMON,
            "data.train_batch_size=8",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "data.max_response_length=128",
            "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        ],
    ),
}
LOGITS_RUNS = {  # name: (pass, tokens, with a backward pass)
    "log-prob + entropy": ("chunked", 8192, False),
    "log-prob + entropy, plain formulas": ("plain", 8192, False),
    "log-prob + entropy + backward": ("chunked", 2048, True),
    "log-prob + entropy + backward, plain formulas": ("plain", 2048, True),
    "head + log-prob + entropy + backward": ("head", 2048, True),
    "head + log-prob + entropy + backward, fused": ("fused", 2048, True),
}
TARGETS = [
    ("vocab 152k, micro batches of 8", "vocab 152k, whole batch", 0.6),
    ("12 layers, gradient checkpointing", "12 layers, no checkpointing", 0.7),
    ("log-prob + entropy", "log-prob + entropy, plain formulas", 0.35),
    ("log-prob + entropy + backward", "log-prob + entropy + backward, plain formulas", None),  # reported
    ("head + log-prob + entropy + backward, fused", "head + log-prob + entropy + backward", None),
]


def logits_pass(kind: str, tokens: int, backward: bool):
    """The inputs (made here, before the measurement) and the pass over them, by kind."""
    import torch

    from rlrig.trainer.model.chunked_logprobs import plain_logprobs_and_entropy, token_logprobs_and_entropy
    from rlrig.trainer.model.fused_logprobs import fused_logprobs_and_entropy

    torch.manual_seed(0)
    vocab = WIDE["vocab_size"]
    targets = torch.randint(0, vocab, (tokens,))
    if kind in ("head", "fused"):
        hidden = torch.randn(tokens, WIDE["hidden_size"], dtype=torch.bfloat16).requires_grad_(backward)
        weight = (torch.randn(vocab, WIDE["hidden_size"]) / 8).to(torch.bfloat16).requires_grad_(backward)
        if kind == "fused":
            return lambda: fused_logprobs_and_entropy(hidden, weight, targets, with_entropy=True)
        return lambda: token_logprobs_and_entropy(hidden @ weight.T, targets, True)
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16).requires_grad_(backward)
    if kind == "plain":
        return lambda: plain_logprobs_and_entropy(logits, targets)
    return lambda: token_logprobs_and_entropy(logits, targets, True)


def logits_child(kind: str, tokens: int, backward: bool) -> None:
    import torch

    run = logits_pass(kind, tokens, backward)
    before = status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    with torch.set_grad_enabled(backward):
        logp, ent = run()
        if backward:
            (logp.sum() + 0.01 * ent.sum()).backward()
    peak = status_kb("VmHWM")
    print(json.dumps({"before_mb": before / 1024, "peak_mb": (peak - before) / 1024, "tokens": tokens}))


def status_kb(field: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(shape: dict, overrides: list[str]) -> None:
    from rlrig.trainer.driver.single_process import single_worker
    from rlrig.trainer.embedded.synthetic import Shape, ensure_model
    from rlrig.trainer.workers.step.request import StepRequest

    path = ensure_model(Shape(**shape))
    with single_worker([f"actor_rollout_ref.model.path={path}", *overrides], path) as (w, batches):
        rows = next(batches)
        before = status_kb("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM, the resident high-water mark, to the current size
        out = w.step(StepRequest(rows, global_step=1, kl_coef=0.001))
        peak = status_kb("VmHWM")
    print(
        json.dumps(
            {
                "before_mb": before / 1024,
                "peak_mb": peak / 1024,
                "step_s": out["timing_s/update_actor"],
                "tokens": out["perf/total_num_tokens"],
            }
        )
    )


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(json.loads(sys.argv[2]), json.loads(sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--logits-child":
        logits_child(*json.loads(sys.argv[2]))
        return 0
    res = {}
    runs = {name: ["--child", json.dumps(shape), json.dumps(o)] for name, (shape, o) in RUNS.items()}
    runs.update({name: ["--logits-child", json.dumps(args)] for name, args in LOGITS_RUNS.items()})
    for name, args in runs.items():
        r = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
        if r.returncode:
            print(r.stderr[-3000:], file=sys.stderr)
            return 1
        res[name] = json.loads(r.stdout.strip().splitlines()[-1])
        during = "added by the pass" if name in LOGITS_RUNS else "during the step"
        print(
            f"{name:46} peak {res[name]['peak_mb']:7.0f} MB {during} (process before it: "
            f"{res[name]['before_mb']:.0f} MB; {res[name]['tokens']:.0f} tokens)",
            flush=True,
        )
    ok = True
    for better, base, target in TARGETS:
        ratio = res[better]["peak_mb"] / res[base]["peak_mb"]
        if target is None:
            print(f"{better} / {base}: {ratio:.2f}x")
            continue
        met = ratio <= target
        ok &= met
        print(f"{better} / {base}: {ratio:.2f}x (target <= {target}x: {'met' if met else 'NOT met'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
