"""A model-based reward (reward_model.enable), as verl scores it: a model with a one-label head, read at the last
token of the prompt and response rendered with the reward model's own chat template. Two scorers, chosen by
reward_model.use_reward_loop as verl chooses: transformers (its legacy RewardModelWorker) or a vLLM engine in
pooling mode (its reward loop, reward/vllm_scorer.py). A scorer runs inside each training worker (colocated) or in
its own workers (workers/reward_worker.py).
"""

from __future__ import annotations

import torch

from ..model import micro_batches as batching
from ..model import offload
from ..model.loading import import_external_lib, model_kwargs


def resolve_path(rm_cfg) -> str:
    """The reward model's directory: reward_model.model.path, else the embedded tiny reward model (built once)."""
    from ..embedded.tiny_reward_model import ensure_tiny_reward_model

    return rm_cfg.model.path or ensure_tiny_reward_model()


def scorer_settings(cfg) -> tuple[int, int | None]:
    """(verl's default max_length: the rollout's prompt + response lengths; the token budget under use_dynamic_bsz)."""
    return (
        cfg.data.max_prompt_length + cfg.data.max_response_length,
        batching.token_budgets(cfg)["reward_model.forward_max_token_len_per_gpu"],
    )


class ChatScorer:
    """What every reward-model scorer shares: the reward model's tokenizer and its rendering of a conversation. A
    scorer implements score_ids (token lists -> one float each, in order) and close, if it holds anything beyond
    itself; score_chats renders and scores conversations through it."""

    def __init__(self, m, path: str, max_length: int):
        from transformers import AutoTokenizer

        import_external_lib(m)
        self.tok = AutoTokenizer.from_pretrained(path, **({"trust_remote_code": True} if m.trust_remote_code else {}))
        self.max_length = max_length

    def render(self, chat: list[dict]) -> list[int]:
        """The conversation with the response as the assistant's turn, in the reward model's template, cut on the
        right."""
        text = self.tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        return self.tok(text, add_special_tokens=False)["input_ids"][: self.max_length]

    def score_chats(self, chats: list[list[dict]]) -> list[float]:
        """Each conversation's score, rendered in the reward model's template (render)."""
        return self.score_ids([self.render(c) for c in chats])

    def close(self) -> None:
        """Release what the scorer holds beyond this object (an engine, a process)."""


class RewardScorer(ChatScorer):
    """reward_model.use_reward_loop=False: transformers, as verl's legacy RewardModelWorker."""

    def __init__(self, rm_cfg, path: str, device: torch.device, default_max_length: int, budget: int | None):
        from transformers import AutoModelForTokenClassification

        m = rm_cfg.model
        super().__init__(m, path, rm_cfg.max_length or default_max_length)
        self.device, self.micro, self.budget = device, rm_cfg.micro_batch_size_per_gpu, budget
        self.offload = m.fsdp_config.param_offload
        # verl: AutoModelForTokenClassification with one label and no dropout; held in bf16 on GPU (nothing trains)
        mkw = model_kwargs(m, path, num_labels=1, classifier_dropout=0.0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype, **mkw).eval()
        self.model.requires_grad_(False)
        self.model.to("cpu" if self.offload else device)

    @torch.no_grad()
    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        """The head's output at each sequence's last token, in micro batches (by count, or by token budget)."""
        lengths = [len(s) for s in seqs]
        # each worker holds the whole model, so micro batches need no agreement between workers
        parts = batching.plan(lengths, 0, len(seqs), self.micro, self.budget, lambda k: k)
        out = [0.0] * len(seqs)
        with offload.module_on(self.model, self.device, self.offload):
            for part in parts:
                rows = list(range(part.start, part.stop)) if isinstance(part, slice) else part
                for i, score in zip(rows, self._forward([seqs[i] for i in rows])):
                    out[i] = score
        return out

    def _forward(self, seqs: list[list[int]]) -> list[float]:
        width = max(len(s) for s in seqs)
        pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else 0
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs], device=self.device)  # right padding
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[..., 0]
        last = mask.sum(-1) - 1
        return logits[torch.arange(len(seqs), device=self.device), last].float().tolist()


class LoopScorer(ChatScorer):
    """reward_model.use_reward_loop=True: a vLLM engine in pooling mode, as verl's reward loop. vLLM batches and
    schedules by itself, so micro_batch_size_per_gpu, use_dynamic_bsz and param_offload (transformers' knobs) play
    no part here, as in verl's reward loop; the engine's sleep mode frees the device between scorings instead.

    With reward_model.rollout.tensor_model_parallel_size = k > 1 (colocated), k consecutive training workers share
    one engine over their GPUs, as verl's colocated reward replicas span k of the pool's GPUs: the group's first
    worker starts it with CUDA_VISIBLE_DEVICES set to the group's GPUs (rollout/tp_groups.py) and scores the whole
    group's inputs; each worker keeps its own scores. Every worker of a group must score at the same time, as they
    do."""

    def __init__(self, rm_cfg, path: str, device: torch.device, default_max_length: int, budget: int | None):
        from transformers import AutoConfig

        from ..devices import showing
        from ..rollout import tp_groups
        from .vllm_scorer import VLLMEngineScorer, max_length

        m, r = rm_cfg.model, rm_cfg.rollout
        conf = AutoConfig.from_pretrained(path, **({"trust_remote_code": True} if m.trust_remote_code else {}))
        super().__init__(m, path, max_length(r, getattr(conf, "max_position_embeddings", None)))
        trust = m.trust_remote_code
        start = lambda visible=None: VLLMEngineScorer(r, path, device.type, self.max_length, trust, visible)
        k, self.engine, self.shared = r.tensor_model_parallel_size, None, None
        if k == 1:
            self.engine = start()
            return
        # the child's own variables name the group's GPUs: under a NOSET flag its environment would otherwise show
        # it only this worker's (child_env), whatever this process's are
        spawn = lambda gpus: start(showing(gpus) if gpus else None)
        key = "reward_model.rollout.tensor_model_parallel_size"
        self.shared = tp_groups.SharedEngine(k, device.type == "cuda", spawn, key)

    def score_ids(self, seqs: list[list[int]]) -> list[float]:
        """Each sequence's score, cut to max_length; under tensor parallelism the group's first rank scores every
        member's share and each member gets its own."""
        seqs = [s[: self.max_length] for s in seqs]  # vLLM refuses what exceeds max_model_len
        if self.shared is None:
            return self.engine.score_ids(seqs)
        return self.shared.ask(seqs, lambda engine, asked: engine.score_ids(asked))

    def close(self) -> None:
        """Stops the engine's process, where this rank runs it."""
        (self.engine or self.shared).close()


def make_scorer(rm_cfg, path: str, device: torch.device, default_max_length: int, budget: int | None) -> ChatScorer:
    """The scorer reward_model.use_reward_loop chooses: the vLLM reward loop (LoopScorer) or transformers
    (RewardScorer)."""
    cls = LoopScorer if rm_cfg.use_reward_loop else RewardScorer
    return cls(rm_cfg, path, device, default_max_length, budget)


def check_installed(rm_cfg) -> None:
    """Before any worker starts: the reward loop's engine must be importable (one line, not a dead actor)."""
    import importlib.util

    from ..errors import ConfigError
    from .vllm_scorer import INSTALL_HINT

    if rm_cfg.enable and rm_cfg.use_reward_loop and importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"reward_model.use_reward_loop=True scores with vLLM, which is not installed here: {INSTALL_HINT}, "
            "or set reward_model.use_reward_loop=False (transformers)"
        )
