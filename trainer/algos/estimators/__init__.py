"""The advantage estimators. A new one is a module in this package that calls `register`, plus its
import below."""

# each module registers itself, in this order, which config errors list the names in: gae and grpo first
from . import gae, grpo  # noqa: F401

# isort: split
from . import (  # noqa: E402,F401
    gdpo,
    gpg,
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
