"""A worker of the reward model's own pool (reward_model.enable_resource_pool): a whole copy of the reward model
on one device, scoring what the training workers send it. Forward passes only, so no process group."""

from __future__ import annotations

from ..config.schema import from_dict
from ..reward.reward_model import make_scorer, scorer_settings
from .base import PoolWorker, single_device


class RewardModelWorker(PoolWorker):
    def __init__(self, cfg_dict: dict, path: str, use_gpu: bool):
        cfg = from_dict(cfg_dict)
        self.scorer = make_scorer(cfg.reward_model, path, single_device(use_gpu), *scorer_settings(cfg))

    def score_chats(self, chats: list[list[dict]]) -> list[float]:
        return self.scorer.score_chats(chats)

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        return self.scorer.score_ids(seqs)
