"""Every metric a worker reports, by verl's name, with how it combines across workers.

Workers each see a shard of the batch; the driver combines their dicts with `reduce`. A metric with
no rule here is an error (a new metric is one line below), never a guess from its name.
"""

from __future__ import annotations

from .algos.rollout_correction import RS_OPTIONS

MEAN, MAX, MIN, SUM, TOKEN_MEAN = "mean", "max", "min", "sum", "token_mean"
# the reserved key each worker adds: its response-token count, the weight of TOKEN_MEAN metrics
TOKENS = "_response_tokens"

RULES: dict[str, str] = {
    # shards hold equally many sequences, so a per-sequence mean over workers is the batch's mean
    "critic/score/mean": MEAN,
    "critic/score/max": MAX,
    "critic/score/min": MIN,
    "critic/rewards/mean": MEAN,
    "critic/advantages/mean": TOKEN_MEAN,
    "critic/vf_explained_var": MEAN,
    "critic/vf_loss": MEAN,
    "critic/vf_clipfrac": MEAN,
    "critic/grad_norm": MEAN,
    "critic/lr": MEAN,
    "response_length/mean": MEAN,
    "response_length/max": MAX,
    "response_length/min": MIN,
    "response_length/clip_ratio": MEAN,
    "actor/pg_loss": MEAN,
    "actor/pg_clipfrac": MEAN,
    "actor/pg_clipfrac_lower": MEAN,
    "actor/ppo_kl": MEAN,
    "actor/entropy": MEAN,
    "actor/kl_loss": MEAN,
    "actor/grad_norm": MEAN,
    "actor/lr": MEAN,
    "actor/reward_kl_penalty": MEAN,
    "actor/moe_aux_loss": MEAN,
    # on-policy distillation (algos/distillation.py), verl's names: each worker's mini-batch means, its extremes
    "distillation/loss": MEAN,
    "distillation/abs_loss": MEAN,
    "distillation/loss_min": MIN,
    "distillation/loss_max": MAX,
    "distillation/pg_clipfrac": MEAN,
    "distillation/ppo_kl": MEAN,
    "distillation/pg_clipfrac_lower": MEAN,
    # the top-k mode's (forward_kl_topk): the mass on the teacher's top k, the overlap of the two top k
    **{f"distillation/{side}_mass": MEAN for side in ("student", "teacher")},
    **{f"distillation/{side}_mass_min": MIN for side in ("student", "teacher")},
    **{f"distillation/{side}_mass_max": MAX for side in ("student", "teacher")},
    "distillation/overlap_ratio": MEAN,
    "distillation/overlap_token_advantage": MEAN,
    # a generative judge (reward/judge.py): its server's counters, reported once per server; the fields its
    # reward function returned
    "reward/judge/requests": SUM,
    "reward/judge/failures": SUM,
    "reward/judge/prompt_tokens": SUM,
    "reward/judge/completion_tokens": SUM,
    "reward/judge/generate_s": MAX,
    "reward/judge/parse_failures": SUM,
    "reward/judge/score/mean": MEAN,
    "reward/judge/score/max": MAX,
    "reward/judge/score/min": MIN,
    "training/rollout_probs_diff_max": MAX,
    "training/rollout_probs_diff_mean": TOKEN_MEAN,
    "training/rollout_probs_diff_std": MEAN,
    "perf/total_num_tokens": SUM,
    "perf/max_memory_allocated_gb": MAX,
    # batch/balance.py: every worker computes the same numbers from all workers' samples
    "global_seqlen/min": MAX,
    "global_seqlen/max": MAX,
    "global_seqlen/minmax_diff": MAX,
    "global_seqlen/balanced_min": MAX,
    "global_seqlen/balanced_max": MAX,
    "global_seqlen/mean": MAX,
    # algos/variance_proxy.py: every worker computes the same numbers from all workers' samples
    "variance_proxy/proxy1_signal_strength": MAX,
    "variance_proxy/proxy2_total_power": MAX,
    "variance_proxy/proxy3_pure_noise": MAX,
    "variance_proxy/expected_a_squared": MAX,
    "variance_proxy/expected_w": MAX,
    # rollout correction (algos/rollout_correction.py): each worker's mean and fractions, combined by its response
    # tokens (exact for rollout_is=token; for sequence, whose fractions count sequences, a token-weighted mean of them)
    "rollout_corr/rollout_is_mean": TOKEN_MEAN,
    "rollout_corr/rollout_is_max": MAX,
    "rollout_corr/rollout_is_min": MIN,
    "rollout_corr/rollout_is_ratio_fraction_high": TOKEN_MEAN,
    "rollout_corr/rollout_is_ratio_fraction_low": TOKEN_MEAN,
    "rollout_corr/rollout_is_batch_norm_factor": MEAN,
    "rollout_corr/rollout_rs_masked_fraction": TOKEN_MEAN,
    "rollout_corr/rollout_rs_seq_masked_fraction": MEAN,
}


def _rejection_sampling_rules() -> dict[str, str]:
    """Rejection sampling's metrics (algos/rollout_correction.py), each option's: what is over tokens combines by
    response tokens, what is over sequences as a mean (the shards hold equally many), extremes by max or min."""
    stats = {"mean": TOKEN_MEAN, "max": MAX, "min": MIN, "std": MEAN, "masked_fraction": TOKEN_MEAN}
    stats.update({f"seq_{s}": MEAN for s in ("mean", "std", "fraction_high", "fraction_low", "masked_fraction")})
    stats.update({"seq_max": MAX, "seq_min": MIN, "seq_max_deviation": MAX})
    rules = {}
    for option in RS_OPTIONS:
        beyond = MEAN if option.startswith("seq_") else TOKEN_MEAN  # fraction_high/low count sequences or tokens
        rules.update({f"rollout_corr/rollout_rs_{option}_fraction_{s}": beyond for s in ("high", "low")})
        rules.update({f"rollout_corr/rollout_rs_{option}_{stat}": how for stat, how in stats.items()})
    return rules


RULES.update(_rejection_sampling_rules())
# the agent loop's (agent/rollout.py): per sample, so extremes by max or min and means over equal shards
for _family in (
    "num_turns",
    "tool_call_counts",
    "timing_s/agent_loop/generate_sequences",
    "timing_s/agent_loop/tool_calls",
):
    RULES.update({f"{_family}/min": MIN, f"{_family}/max": MAX, f"{_family}/mean": MEAN})
# an OpenAI-client agent's samples that ended failed, timed out or over budget (agent/openai_agent.py): counts
RULES.update({f"agent/openai/{_outcome}": SUM for _outcome in ("failed", "timed_out", "over_budget")})

# families: the phases run in parallel on every worker, so the step waits for the slowest
PREFIXES: dict[str, str] = {
    "timing_s/": MAX,
    # model/moe.py: every worker reports the whole batch's expert load (its counts summed over the workers)
    "actor/moe/": MAX,
    "rollout/moe/": MAX,
}


# families whose middle part is the user's (gdpo/<reward key>/<stat>): the rule by the last part
BY_LAST_PART: dict[str, dict[str, str]] = {
    # reward/components.py: mean and std are the whole batch's on every worker, max and min each worker's own
    "gdpo/": {"mean": MEAN, "std": MEAN, "max": MAX, "min": MIN},
}


def rule(name: str) -> str:
    if name in RULES:
        return RULES[name]
    for prefix, by_last in BY_LAST_PART.items():
        if name.startswith(prefix) and name.rsplit("/", 1)[-1] in by_last:
            return by_last[name.rsplit("/", 1)[-1]]
    for prefix, how in PREFIXES.items():
        if name.startswith(prefix):
            return how
    raise KeyError(f"metric {name!r} has no rule for combining workers; add it to rlrig/trainer/metrics.py")


def reduce(results: list[dict]) -> dict:
    """One dict from the workers' dicts (a worker may lack a metric, e.g. one it had no tokens for)."""
    weights = [r.get(TOKENS, 1.0) for r in results]
    out = {}
    for name in sorted(set().union(*results) - {TOKENS}):
        pairs = [(r[name], w) for r, w in zip(results, weights) if name in r]
        vals = [v for v, _ in pairs]
        how = rule(name)
        if how == MAX:
            out[name] = max(vals)
        elif how == MIN:
            out[name] = min(vals)
        elif how == SUM:
            out[name] = sum(vals)
        elif how == TOKEN_MEAN:
            total = sum(w for _, w in pairs)
            out[name] = sum(v * w for v, w in pairs) / total if total else sum(vals) / len(vals)
        else:
            out[name] = sum(vals) / len(vals)
    return out
