"""verl 0.9's algorithm keys whose checks verl makes only when the step first reads them (GDPO's reward keys and
weights, DRO's beta), made at start-up here, each in one line naming the key and the fix."""

from __future__ import annotations

from ..errors import ConfigError


def validate_dro(cfg) -> None:
    """verl's compute_policy_loss_dro raises unless policy_loss.dro_beta is positive (the domain refuses 0 and less)."""
    pl = cfg.actor_rollout_ref.actor.policy_loss
    if pl.loss_mode == "dro" and pl.dro_beta is None:
        raise ConfigError(
            "actor_rollout_ref.actor.policy_loss.loss_mode=dro needs its penalty: set "
            "actor_rollout_ref.actor.policy_loss.dro_beta to a positive value"
        )


def validate_gdpo(cfg) -> None:
    """verl's compute_gdpo_outcome_advantage asserts gdpo_reward_keys; its weights are one per key."""
    al = cfg.algorithm
    keys, weights = al.gdpo_reward_keys, al.gdpo_reward_weights
    if al.adv_estimator != "gdpo":
        return
    if not keys:
        raise ConfigError(
            "algorithm.adv_estimator=gdpo needs the reward components it normalizes one by one: set "
            "algorithm.gdpo_reward_keys to the keys of the dict your reward function returns, e.g. "
            "[format_reward,accuracy_reward]"
        )
    if weights is not None and len(weights) != len(keys):
        raise ConfigError(
            f"algorithm.gdpo_reward_weights has {len(weights)} weights for {len(keys)} algorithm.gdpo_reward_keys: "
            "give one weight per key, or leave it out (1 each)"
        )


def validate_algorithm_keys(cfg) -> None:
    validate_dro(cfg)
    validate_gdpo(cfg)
