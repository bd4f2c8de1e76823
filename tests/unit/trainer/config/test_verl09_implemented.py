"""verl 0.9 keys rlrig implements (issue: every key of verl 0.9's config does what verl does with it): each key's
effect, table-driven, and the keys verl 0.9.1 itself refuses refused in one line with the fix."""

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.errors import ConfigError

MODEL = "actor_rollout_ref.model.path=/m"


@pytest.mark.parametrize(
    "override,fix",
    [
        ("+actor_rollout_ref.actor.policy_loss.tau_pos=1.0", "actor_rollout_ref.actor.tau_pos"),
        ("+actor_rollout_ref.actor.policy_loss.tau_neg=1.05", "actor_rollout_ref.actor.tau_neg"),
    ],
)
def test_sapo_temperatures_under_policy_loss_are_refused_as_verl_0_9_refuses_them(override, fix):
    """verl 0.9.1's PolicyLossConfig has no tau_pos/tau_neg (hydra's instantiate raises a TypeError); SAPO reads them
    from the actor in verl and rlrig, where they take effect."""
    with pytest.raises(ConfigError) as e:
        parse_overrides([MODEL, override])
    text = str(e.value)
    assert "\n" not in text and text.startswith(override[1:].split("=")[0]) and "set that" in text and fix in text
    cfg = parse_overrides([MODEL, f"{fix}=1.5"])
    assert cfg.actor_rollout_ref.actor.tau_pos + cfg.actor_rollout_ref.actor.tau_neg in (1.5 + 1.05, 1.0 + 1.5)
