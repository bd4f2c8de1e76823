"""verl's reward managers (reward_model.reward_manager): how a sample's score becomes its reward.
naive: the score as it is; dapo: plus DAPO's soft penalty for responses that run into the length limit
(reward_model.reward_kwargs.overlong_buffer_cfg.*, and max_resp_len). Any other name, or
reward_model.reward_loop_source=importlib, is a reward manager of your own (reward/own_managers.py)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

MANAGERS = ("naive", "dapo")
KWARGS = {"naive": set(), "dapo": {"overlong_buffer_cfg", "max_resp_len"}}
OVERLONG_KEYS = {"enable", "len", "penalty_factor", "log"}


@dataclass(frozen=True)
class Overlong:
    """DAPO's soft overlong penalty, the dapo manager's: 0 up to max_resp_len - length tokens, then falling linearly
    to -penalty_factor at max_resp_len."""

    length: int  # the buffer: the last `length` tokens before max_resp_len
    penalty_factor: float
    max_resp_len: int

    def penalty(self, response_len: int) -> float:
        """The amount (<= 0) added to the score of a response this many tokens long."""
        # expected = max_resp_len - length ;  penalty = min(-(response_len - expected) / length * factor, 0)
        expected = self.max_resp_len - self.length
        return min(-(response_len - expected) / self.length * self.penalty_factor, 0.0)


def is_own(rm_cfg) -> bool:
    """Whether reward_model names a reward manager of your own rather than rlrig's naive or dapo."""
    return rm_cfg.reward_loop_source != "register" or rm_cfg.reward_manager not in MANAGERS


# verl 0.9's own reward-loop managers beside naive and dapo: they run as classes of your own where verl is installed
VERL_REGISTERED = ("gdpo", "rate_limited", "remote")


def check_name(rm_cfg, custom_path: str | None) -> None:
    """With source=register and no file to @register a name in (custom_reward_function.path or
    reward_loop_module_path), the name is one of rlrig's or verl 0.9's own."""
    name = rm_cfg.reward_manager
    if rm_cfg.reward_loop_source != "register" or custom_path or rm_cfg.reward_loop_module_path:
        return
    if name not in (*MANAGERS, *VERL_REGISTERED):
        raise ConfigError(
            f"reward_model.reward_manager={name}: no reward manager of that name; rlrig's are {', '.join(MANAGERS)} "
            f"(verl 0.9's {', '.join(VERL_REGISTERED)} run where verl is installed). A class of your own is named by "
            "reward.reward_manager.source=importlib with module.path, or @register-ed in the file "
            "custom_reward_function.path loads"
        )


def overlong(rm_cfg) -> Overlong | None:
    """The dapo manager's overlong penalty, or None; every reward_kwargs key checked as verl's managers take them.
    A manager of your own reads reward_kwargs itself (verl's config.reward.reward_kwargs): None, nothing checked."""
    name, kw, key = rm_cfg.reward_manager, rm_cfg.reward_kwargs, "reward_model.reward_kwargs"
    if is_own(rm_cfg):
        return None
    unknown = sorted(set(kw) - KWARGS[name])
    if unknown:
        raise ConfigError(
            f"{key}.{unknown[0]}: verl's {name} reward manager takes no such argument"
            + (f" (it takes {', '.join(sorted(KWARGS[name]))})" if KWARGS[name] else "")
        )
    cfg = kw.get("overlong_buffer_cfg") or {}
    unknown = sorted(set(cfg) - OVERLONG_KEYS)
    if unknown:
        raise ConfigError(f"{key}.overlong_buffer_cfg.{unknown[0]}: the keys are {', '.join(sorted(OVERLONG_KEYS))}")
    if not cfg.get("enable", False):
        return None
    if cfg.get("log", False):
        raise ConfigError(
            f"{key}.overlong_buffer_cfg.log=True: rlrig does not record the penalty per sample; set it False"
        )
    if rm_cfg.enable:
        raise ConfigError(
            f"{key}.overlong_buffer_cfg.enable=True with reward_model.enable=True: verl takes the reward "
            "model's score as it is and applies the overlong penalty to function rewards only"
        )
    length, max_len = cfg.get("len"), kw.get("max_resp_len")
    if not isinstance(length, int) or length < 1 or not isinstance(max_len, int) or max_len < length:
        raise ConfigError(
            f"{key}: the overlong penalty needs overlong_buffer_cfg.len >= 1 and max_resp_len >= len "
            f"(got len={length}, max_resp_len={max_len}); set +{key}.max_resp_len=<data.max_response_length>"
        )
    return Overlong(length, float(cfg.get("penalty_factor", 1.0)), max_len)
