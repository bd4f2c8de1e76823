"""A model-based reward (reward_model.enable), as verl's RewardModelWorker scores: a Hugging Face model with a
one-label head, read at the last token of the prompt and response rendered with the reward model's own chat
template. The scorer runs inside each training worker (colocated) or in its own workers (reward_worker.py).
"""

from __future__ import annotations

import torch

from . import batching, offload
from .models import import_external_lib, model_kwargs


def resolve_path(rm_cfg) -> str:
    from .tiny_reward_model import ensure_tiny_reward_model

    return rm_cfg.model.path or ensure_tiny_reward_model()


def scorer_settings(cfg) -> tuple[int, int | None]:
    """(verl's default max_length: the rollout's prompt + response lengths; the token budget under use_dynamic_bsz)."""
    return (cfg.data.max_prompt_length + cfg.data.max_response_length,
            batching.token_budgets(cfg)["reward_model.forward_max_token_len_per_gpu"])


class RewardScorer:
    def __init__(self, rm_cfg, path: str, device: torch.device, default_max_length: int, budget: int | None):
        from transformers import AutoModelForTokenClassification, AutoTokenizer

        m = rm_cfg.model
        self.device, self.micro, self.budget = device, rm_cfg.micro_batch_size_per_gpu, budget
        self.max_length = rm_cfg.max_length or default_max_length
        self.offload = m.fsdp_config.param_offload
        import_external_lib(m)
        kw = {"trust_remote_code": True} if m.trust_remote_code else {}
        self.tok = AutoTokenizer.from_pretrained(path, **kw)
        # verl: AutoModelForTokenClassification with one label and no dropout; held in bf16 on GPU (nothing trains)
        mkw = model_kwargs(m, path, num_labels=1, classifier_dropout=0.0)
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        self.model = AutoModelForTokenClassification.from_pretrained(path, dtype=dtype, **mkw).eval()
        self.model.requires_grad_(False)
        self.model.to("cpu" if self.offload else device)

    def render(self, chat: list[dict]) -> list[int]:
        """The conversation with the response as the assistant's turn, in the reward model's template, cut on the right."""
        text = self.tok.apply_chat_template(chat, add_generation_prompt=False, tokenize=False)
        return self.tok(text, add_special_tokens=False)["input_ids"][:self.max_length]

    def score_chats(self, chats: list[list[dict]]) -> list[float]:
        return self.score_ids([self.render(c) for c in chats])

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
