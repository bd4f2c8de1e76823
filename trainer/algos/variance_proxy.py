"""verl's variance_proxy/* metrics (trainer/ppo/metric_utils.py compute_variance_proxy_metrics): a forward-only
view of the policy gradient's variance, for any advantage estimator, whenever the old-log-prob pass yields
sum_pi_squared (actor.calculate_sum_pi_squared=True). Over the whole batch: every worker reports the same numbers.

    w_t  = 1 - 2 pi(y_t) + sum_v pi(v)^2            (times rho_t^2 with rollout IS weights)
    W    = sum_t m_t w_t,   a = sum_t m_t A_t / (sum_t m_t + 1e-8)       (per sequence)
    proxy1_signal_strength = ||g||^2                 (actor/grad_norm squared; 0 when the actor did not update)
    proxy2_total_power     = E[a^2 max(W, 0)]        with IS: E[rho_bar^2 a^2 max(W_orig, 0)], rho_bar the sequence's
                                                     mean weight, W_orig = sum_t m_t w_t / max(rho_t^2, 1e-10)
    proxy3_pure_noise      = max(0, (proxy2 - proxy1) / (N - 1))   N sequences; 0 without a grad norm or for N = 1
    expected_a_squared     = E[a^2],   expected_w = E[W]
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _masked_sum(x, mask):
    return (torch.where(mask.bool(), x, 0.0) * mask).sum(-1)


def variance_proxy_metrics(
    advantages: torch.Tensor,
    old_logp: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    mask: torch.Tensor,
    is_weights: torch.Tensor | None,
    grad_norm: float | None,
    batch_sum: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, float]:
    """The five metrics from this worker's [B, R] shard; batch_sum sums over every worker's shard."""
    w = 1 - 2 * old_logp.exp() + sum_pi_squared
    if is_weights is not None:
        w = w * is_weights.detach() ** 2
    a = _masked_sum(advantages, mask) / (mask.sum(-1) + 1e-8)
    big_w = _masked_sum(w, mask)
    if is_weights is not None:
        rho = _masked_sum(is_weights, mask) / (mask.sum(-1) + 1e-8)
        w_orig = _masked_sum(w / (is_weights.detach() ** 2).clamp(min=1e-10), mask).clamp(min=0.0)
        power = rho**2 * a**2 * w_orig
    else:
        power = a**2 * big_w.clamp(min=0.0)
    sums = torch.stack([power.sum(), (a**2).sum(), big_w.sum(), torch.tensor(float(len(a)), device=a.device)])
    power_sum, a2_sum, w_sum, n = batch_sum(sums.double()).tolist()
    proxy1 = grad_norm**2 if grad_norm is not None else None
    proxy3 = max(0.0, (power_sum / n - proxy1) / (n - 1)) if proxy1 is not None and n > 1 else 0.0
    return {
        "variance_proxy/proxy1_signal_strength": proxy1 if proxy1 is not None else 0.0,
        "variance_proxy/proxy2_total_power": power_sum / n,
        "variance_proxy/proxy3_pure_noise": proxy3,
        "variance_proxy/expected_a_squared": a2_sum / n,
        "variance_proxy/expected_w": w_sum / n,
    }
