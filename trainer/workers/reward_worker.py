"""A worker of the reward model's own pool (reward_model.enable_resource_pool): a whole copy of the reward model
on one device, scoring what the training workers send it, or serving a generative judge (reward/judge.py) that
their reward code calls. Forward passes only, so no process group."""

from __future__ import annotations

from contextlib import ExitStack

from .. import determinism
from ..config.schema import from_dict
from ..reward.judge import judge_spec
from ..reward.judge_server import JudgeServer
from ..reward.reward_model import make_scorer, scorer_settings
from ..reward.rules import serves_judge
from . import profiling
from .base import PoolWorker, single_device


class RewardModelWorker(PoolWorker):
    def __init__(self, cfg_dict: dict, path: str, use_gpu: bool, rank: int = 0):
        """rank: this worker's place in the reward model's pool (which its profiler's ranks choose among)."""
        cfg = from_dict(cfg_dict)
        device = single_device(use_gpu)
        determinism.engine_env(cfg, device.type)  # a vLLM scorer or judge starts with it
        # verl's reward loop has no profiler; its legacy reward-model workers do
        roles = {} if cfg.reward_model.use_reward_loop else {"reward_model": "reward_model"}
        self.profiler = profiling.worker_profiler(cfg, rank, roles, "reward_model", device)
        self.rank, self.judge, self.releases = rank, None, ExitStack()
        if serves_judge(cfg):  # a generative judge: served for the training workers' reward code to call
            import ray

            self.judge = JudgeServer(judge_spec(cfg.reward_model, path, device.type), ray.util.get_node_ip_address())
            self.releases.callback(self.judge.close)
            return
        self.scorer = make_scorer(cfg.reward_model, path, device, *scorer_settings(cfg))
        self.releases.callback(self.scorer.close)

    def shutdown(self) -> None:
        self.releases.close()

    def judge_address(self) -> tuple[str, int]:
        """The generative judge's host:port and this worker's place in the pool."""
        return self.judge.address, self.rank

    def score_chats(self, chats: list[list[dict]]) -> list[float]:
        with self.profiler.phase("reward"):
            return self.scorer.score_chats(chats)

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        with self.profiler.phase("reward"):
            return self.scorer.score_ids(seqs)
