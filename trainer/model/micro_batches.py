"""How a worker's rows are cut into micro batches: a fixed number of sequences each, or (verl's
use_dynamic_bsz) as few micro batches as keep each under a token budget, balanced by token count.

Under data parallelism every rank must run the same number of forwards and backwards (each is a
collective under FSDP, each backward an all-reduce under DDP), so the count is agreed across ranks
(`agree`: the maximum over all of them) before the rows are partitioned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

Part = slice | list  # consecutive rows, or any rows by index


def fixed(start: int, stop: int, size: int | None) -> list[slice]:
    size = size or (stop - start)
    return [slice(s, min(s + size, stop)) for s in range(start, stop, size)]


def balanced(lengths: list[int], parts: int) -> list[list[int]]:
    """Indices of `lengths` in `parts` groups of near-equal total: longest first, each into the group with
    the least so far (fewest items on a tie); each group in ascending index order."""
    groups: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = min(range(parts), key=lambda g: (loads[g], len(groups[g]), g))
        groups[g].append(i)
        loads[g] += lengths[i]
    return [sorted(g) for g in groups]


def parts_needed(lengths: list[int], max_tokens: int) -> int:
    """The fewest balanced groups in which none exceeds max_tokens (a sequence longer than the budget
    goes alone: config validation keeps the budget at least the longest possible sequence)."""
    k = max(1, math.ceil(sum(lengths) / max_tokens))
    while k < len(lengths) and max(sum(lengths[i] for i in g) for g in balanced(lengths, k)) > max_tokens:
        k += 1
    return min(k, max(1, len(lengths)))


def token_budget(
    lengths: list[int], start: int, stop: int, max_tokens: int, agree: Callable[[int], int]
) -> list[list[int]]:
    """Rows start..stop-1 as index lists within the token budget, in the number of micro batches every rank agrees
    on."""
    own = lengths[start:stop]
    k = min(agree(parts_needed(own, max_tokens)), len(own))
    return [[start + i for i in g] for g in balanced(own, k) if g]


def plan(
    lengths: list[int], start: int, stop: int, micro: int | None, max_tokens: int | None, agree: Callable[[int], int]
) -> list[Part]:
    """The micro batches of rows start..stop-1: by token budget when max_tokens is set, else `micro` rows each."""
    if max_tokens:
        return token_budget(lengths, start, stop, max_tokens, agree)
    return fixed(start, stop, micro)


def rows(
    attention_mask, start: int, stop: int, micro: int | None, max_tokens: int | None, agree: Callable[[int], int]
) -> list[Part]:
    """plan() over a padded batch: its sequence lengths are read (a device sync) only when a token budget needs them."""
    lengths = attention_mask.sum(-1).tolist() if max_tokens else []
    return plan(lengths, start, stop, micro, max_tokens, agree)


@dataclass
class MiniBatches:
    """A worker's rows as mini batches (one optimizer step each), each as its micro batches (gradients
    accumulated); `rows`: the rows of a full mini batch, which scales each micro batch's share of the gradient."""

    parts: list[list[Part]]
    rows: int


def sequence_parallel(cfg) -> dict[str, int]:
    """Each role's ulysses_sequence_parallel_size (the reference's unset: the actor's, as verl)."""
    a = cfg.actor_rollout_ref
    ref = a.ref.ulysses_sequence_parallel_size
    sp = a.actor.ulysses_sequence_parallel_size
    return {"actor": sp, "ref": sp if ref is None else ref, "critic": cfg.critic.ulysses_sequence_parallel_size}


def mini_batch_prompts(cfg) -> dict[str, int]:
    """Each update's mini batch in prompts, by key: the actor's, and the critic's own where it trains with one."""
    minis = {"actor_rollout_ref.actor.ppo_mini_batch_size": cfg.actor_rollout_ref.actor.ppo_mini_batch_size}
    if cfg.critic_in_use and cfg.critic.ppo_mini_batch_size is not None:
        minis["critic.ppo_mini_batch_size"] = cfg.critic.ppo_mini_batch_size
    return minis


def shares_by_sample(cfg) -> bool:
    """Whether colocated engines generate the step by sample: where data.train_batch_size prompts do not divide over
    the training workers (verl's 16 prompts x 16 samples on 32 GPUs), each worker generates an equal share of the
    prompts x n samples, a prompt's samples then spread over workers as verl's agent loops spread them over its
    servers; otherwise each worker generates n samples of its own prompts."""
    t = cfg.trainer
    return cfg.actor_rollout_ref.hybrid_engine and cfg.data.train_batch_size % (t.nnodes * t.n_gpus_per_node) != 0


def splits_groups(cfg) -> bool:
    """Whether a prompt's samples may sit on several data-parallel groups of workers. A rollout pool's batch is
    shared by sample, as verl dispatches it, so where its prompts, or a mini batch's, do not divide evenly over the
    workers a prompt's samples are cut apart, and its advantages are then computed over the whole batch
    (batch/split_groups.py). Colocated engines generate each worker's own prompts, whole (validation keeps those
    even), unless the step is shared by sample (shares_by_sample)."""
    a, t = cfg.actor_rollout_ref, cfg.trainer
    if a.hybrid_engine:
        return shares_by_sample(cfg)
    workers = t.nnodes * t.n_gpus_per_node
    groups = workers // sequence_parallel(cfg)["actor"]
    return cfg.data.train_batch_size % workers != 0 or any(m % groups for m in mini_batch_prompts(cfg).values())


def per_worker_mini_batch(cfg, world: int, role: str = "actor") -> int:
    """Sequences in each worker's share of a mini batch: ppo_mini_batch_size prompts x n samples over the
    data-parallel groups (the ranks of one sequence-parallel group share their samples, as in verl). The critic's
    own ppo_mini_batch_size where set, else the actor's (verl's default for it)."""
    a, own = cfg.actor_rollout_ref, cfg.critic.ppo_mini_batch_size if role == "critic" else None
    prompts = a.actor.ppo_mini_batch_size if own is None else own
    return prompts * a.rollout.n // (world // sequence_parallel(cfg)["actor"])


def size(part: Part) -> int:
    return part.stop - part.start if isinstance(part, slice) else len(part)


def token_budgets(cfg) -> dict[str, int | None]:
    """The token budget of each pass's micro batches under use_dynamic_bsz (None: by count), with verl's
    defaults: the rollout, reference and critic follow the actor's switch and budget unless set, the reward model the
    critic's. A sequence-parallel group's budget is the sum of its ranks' (verl: max_token_len x sp)."""
    a, r, ref, c = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.ref, cfg.critic
    rm, sp = cfg.reward_model, sequence_parallel(cfg)
    on = lambda flag: a.use_dynamic_bsz if flag is None else flag
    critic_forward = c.forward_max_token_len_per_gpu or c.ppo_max_token_len_per_gpu  # one worker's
    return {
        "reward_model.forward_max_token_len_per_gpu": (rm.forward_max_token_len_per_gpu or critic_forward)
        if on(rm.use_dynamic_bsz if rm.use_dynamic_bsz is not None else c.use_dynamic_bsz)
        else None,
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": a.ppo_max_token_len_per_gpu * sp["actor"]
        if a.use_dynamic_bsz
        else None,
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": (
            r.log_prob_max_token_len_per_gpu or a.ppo_max_token_len_per_gpu
        )
        * sp["actor"]
        if on(r.log_prob_use_dynamic_bsz)
        else None,
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": (
            ref.log_prob_max_token_len_per_gpu or a.ppo_max_token_len_per_gpu
        )
        * sp["ref"]
        if on(ref.log_prob_use_dynamic_bsz)
        else None,
        "critic.ppo_max_token_len_per_gpu": c.ppo_max_token_len_per_gpu * sp["critic"]
        if on(c.use_dynamic_bsz)
        else None,
        "critic.forward_max_token_len_per_gpu": critic_forward * sp["critic"] if on(c.use_dynamic_bsz) else None,
    }
