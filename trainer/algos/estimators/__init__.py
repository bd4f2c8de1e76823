"""The advantage estimators. A new one is a module in this package that calls `register`, plus its
import below."""

from . import (  # noqa: E402,F401  (each registers itself)
    gae,
    gpg,
    grpo,
    grpo_passk,
    opo,
    optimal_token_baseline,
    reinforce_pp,
    reinforce_pp_baseline,
    remax,
    rloo,
)
from .registry import ESTIMATORS, AdvantageInput, Estimator, register

__all__ = ["ESTIMATORS", "AdvantageInput", "Estimator", "register", "get"]


def get(name: str) -> Estimator:
    """The estimator called `name`; config validation has already refused unknown names."""
    return ESTIMATORS[name]
