"""The policy losses. A new one is a module in this package that calls `register`, plus its import below."""

from . import cispo, clip_cov, dro, geo_mean, gpg, gspo, kl_cov, sapo, vanilla  # noqa: E402,F401  (each registers itself)
from .registry import POLICY_LOSSES, PolicyLoss, register

__all__ = ["POLICY_LOSSES", "PolicyLoss", "register", "get"]


def get(name: str) -> PolicyLoss:
    """The loss called `name`; config validation has already refused unknown names."""
    return POLICY_LOSSES[name]
