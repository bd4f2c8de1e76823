"""A worker of the reward model's own pool (reward_model.enable_resource_pool): a whole copy of the reward model
on one device, scoring what the training workers send it. Forward passes only, so no process group."""

from __future__ import annotations

import torch

from rlrig.trainer.model.devices import gpu_index


class RewardModelWorker:
    def __init__(self, cfg_dict: dict, path: str, use_gpu: bool):
        from rlrig.trainer.config.schema import from_dict
        from rlrig.trainer.reward.reward_model import make_scorer, scorer_settings

        cfg = from_dict(cfg_dict)
        torch.set_num_threads(1)
        device = torch.device("cuda", gpu_index()) if use_gpu else torch.device("cpu")
        self.scorer = make_scorer(cfg.reward_model, path, device, *scorer_settings(cfg))

    def score_chats(self, chats: list[list[dict]]) -> list[float]:
        return self.scorer.score_chats(chats)

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        return self.scorer.score_ids(seqs)

    def node_ip(self) -> str:
        import ray

        return ray.util.get_node_ip_address()
