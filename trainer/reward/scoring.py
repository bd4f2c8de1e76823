"""Scoring sampled responses: with the reward function, the reward model, or both (a custom function that takes
the model's score as `rm_score`), through the reward manager."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from ..batch.step_batch import StepBatch
from ..errors import ConfigError, first_line, raised_where
from ..rollout.engines import Rollout
from .judge import NO_JUDGE, JudgeLink, NoJudge
from .managers import Overlong, overlong
from .own_managers import OwnManager
from .rules import reward_fn

# the key under which an agent loop's own reward_score rides with its sample's agent-loop fields (agent/own_loops.py)
LOOP_SCORE = "__agent_loop_reward_score__"


class RewardFunctionError(ConfigError):
    """A reward function raised: the run stops with its error in one line (main prints it), as a reward manager or
    an agent loop of your own that raises does."""


@dataclass
class RewardSource:
    """Where a sample's reward comes from, chosen once when a worker is built, so that the step never asks: score()
    reads it for every batch. `fn(data_source, solution_str, ground_truth, extra_info[, rm_score=...])` returns a
    number or verl's dict with "score" and fields of its own; it gets rm_score when a reward model scores too.
    `model(kind, inputs)` scores model_inputs()'s conversations or token lists, one float each. At least one of
    them is set; the dapo manager's overlong penalty is added to whatever they give. `own`, where set, scores every
    sample instead (a reward manager of your own, reward/own_managers.py); fn is then its compute_score."""

    fn: Callable | None  # the rule or custom function; None: the reward model's score is the reward
    model: Callable[[str, list], list[float]] | None  # ("chats" | "ids", inputs) -> the reward model's scores
    # decodes responses for the model to read in its own chat template; None: it reads the policy's tokens as they are
    input_tokenizer: object | None
    prompt_key: str
    overlong: Overlong | None  # the dapo manager's penalty
    own: OwnManager | None = None  # a reward manager of your own: its run_single's score and reward_extra_info
    # a generative judge the function or the manager calls (reward/judge.py): its address and tokenizer are passed
    # to every call, which then run together so that the judge answers them in batches
    judge: JudgeLink | NoJudge = NO_JUDGE

    @classmethod
    def of(
        cls, cfg, tokenizer, model=None, input_tokenizer=None, judge: JudgeLink | NoJudge = NO_JUDGE
    ) -> RewardSource:
        """The run's: its reward function (rules.reward_fn), the dapo manager's penalty, a reward manager of your
        own built with that function as its compute_score."""
        fn = reward_fn(cfg)
        own = OwnManager.of(cfg, tokenizer, fn, judge.kwargs())
        return cls(fn, model, input_tokenizer, cfg.data.prompt_key, overlong(cfg.reward_model), own, judge)

    def metrics(self, fields: list[dict]) -> dict:
        """The judge's metrics for a scoring whose samples returned `fields` ({} without a judge)."""
        return self.judge.metrics(fields)

    def call_all(self, calls: list[tuple[tuple, dict]]) -> list:
        """fn(*args, **kwargs) for each call, in order: coroutine functions gathered on one event loop (as verl's
        reward loop runs them); plain ones one after another, or in threads where a judge answers them in batches.
        The judge's address and tokenizer are added to each call's keywords."""
        extra = self.judge.kwargs()
        try:
            if inspect.iscoroutinefunction(self.fn):

                async def gathered():
                    return await asyncio.gather(*(self.fn(*a, **kw, **extra) for a, kw in calls))

                with ThreadPoolExecutor(max_workers=1) as lane:  # a loop of its own, whatever the caller's thread runs
                    return lane.submit(asyncio.run, gathered()).result() if calls else []
            if not self.judge.concurrent:
                return [self.fn(*a, **kw) for a, kw in calls]
            with ThreadPoolExecutor(max_workers=max(1, min(len(calls), 64))) as pool:
                return list(pool.map(lambda c: self.fn(*c[0], **c[1], **extra), calls))
        except Exception as e:  # a user's reward code: the run stops in one line naming it, where it raised
            name = getattr(self.fn, "__qualname__", repr(self.fn))
            raise RewardFunctionError(
                f"reward function {name} raised {type(e).__name__}: {first_line(e)}{raised_where(e)}"
            ) from e


def model_inputs(rows: list[dict], ro: Rollout, n: int, src: RewardSource) -> tuple[str, list]:
    """What the reward model reads for each sample: the conversation with the response as the assistant's turn
    (verl decodes the response and drops the EOS text), or the policy's own prompt and response tokens."""
    prompt_mask = ro.attention_mask[:, : ro.prompt_len].bool()
    out = []
    for i in range(len(ro.input_ids)):
        # the whole response, tool and user turns too (verl's reward model reads the transcript)
        resp = ro.input_ids[i, ro.prompt_len :][ro.attention_mask[i, ro.prompt_len :].bool()].tolist()
        if src.input_tokenizer is not None:
            text = src.input_tokenizer.decode(resp)
            if src.input_tokenizer.eos_token:
                text = text.replace(src.input_tokenizer.eos_token, "")
            out.append(list(rows[i // n][src.prompt_key]) + [{"role": "assistant", "content": text}])
        else:
            out.append(ro.input_ids[i, : ro.prompt_len][prompt_mask[i]].tolist() + resp)
    return ("ids" if src.input_tokenizer is None else "chats"), out


def score(
    tokenizer,
    src: RewardSource,
    rows: list[dict],
    ro: Rollout,
    n: int,
    turns: list[dict] | None = None,
    number_as_acc: bool = False,
) -> tuple[torch.Tensor, list[str], list[dict]]:
    """The reward of each sample (prompt i's n samples at rows i*n .. i*n+n-1), its decoded text, and the fields a
    reward function returned beside the score (verl's reward_extra_info: `acc`, `pred`, ...; {} for a number, or
    with number_as_acc {"acc": the number} before the overlong penalty, as verl 0.9's reward loop records it).
    turns: each sample's agent-loop fields (turn_scores, tool_rewards, num_turns; a loop of your own's extra_fields),
    which the function finds in its extra_info as in verl; a loop of your own's reward_score is the sample's score
    as it stands (verl calls no reward function for it)."""
    texts = tokenizer.batch_decode(ro.input_ids[:, ro.prompt_len :].tolist(), skip_special_tokens=True)
    rm = src.model(*model_inputs(rows, ro, n, src)) if src.model else None
    lengths = ro.attention_mask[:, ro.prompt_len :].sum(-1).tolist()  # tool and user turns count (verl's dapo)
    with src.judge.awake():
        own = own_scores(src.own, rows, ro, n, turns) if src.own else {}
        called = function_scores(src, rows, texts, n, turns, own, rm)
    out, extras = [], []
    for i in range(len(texts)):
        if turns is not None and LOOP_SCORE in turns[i]:  # an agent loop of your own scored it: no function called
            out.append(float(turns[i][LOOP_SCORE]))
            extras.append({})
            continue
        if i in own:  # verl's reward loop: the manager's score as it is, its reward_extra_info as the fields
            out.append(own[i][0])
            extras.append(own[i][1])
            continue
        s = rm[i] if src.fn is None else called[i]
        fields = {}
        if isinstance(s, dict):  # verl's functions may return {"score": ..., other fields}
            fields, s = dict(s), s["score"]
        elif number_as_acc and src.fn is not None:
            fields = {"acc": s}
        s = float(s)
        if src.overlong:
            s += src.overlong.penalty(int(lengths[i]))
        out.append(s)
        extras.append(fields)
    return torch.tensor(out), texts, extras


def function_scores(
    src: RewardSource, rows: list[dict], texts: list[str], n: int, turns, own: dict, rm: list | None
) -> dict[int, object]:
    """What the reward function returns for each sample that neither an agent loop of your own nor a reward manager
    of your own scored, by sample (with rm_score where the reward model scores too)."""
    if src.fn is None:
        return {}
    todo = [i for i in range(len(texts)) if i not in own and (turns is None or LOOP_SCORE not in turns[i])]
    calls = []
    for i in todo:
        r = rows[i // n]
        info = r.get("extra_info") if turns is None else {**(r.get("extra_info") or {}), **turns[i]}
        truth = (r.get("reward_model") or {}).get("ground_truth")
        calls.append(((r["data_source"], texts[i], truth, info), {"rm_score": rm[i]} if rm is not None else {}))
    return dict(zip(todo, src.call_all(calls), strict=True))


def own_scores(
    own: OwnManager, rows: list[dict], ro: Rollout, n: int, turns: list[dict] | None
) -> dict[int, tuple[float, dict]]:
    """A reward manager of your own's score and reward_extra_info of each sample no agent loop of your own scored,
    by sample: each handed over with its real prompt and response tokens."""
    todo = [i for i in range(len(ro.input_ids)) if turns is None or LOOP_SCORE not in turns[i]]
    P, mask = ro.prompt_len, ro.attention_mask.bool()
    samples = [
        (
            rows[i // n],
            ro.input_ids[i, :P][mask[i, :P]].tolist(),
            ro.input_ids[i, P:][mask[i, P:]].tolist(),
            None if turns is None else turns[i],
        )
        for i in todo
    ]
    return dict(zip(todo, own.scores(samples), strict=True))


def score_batch(
    tokenizer, src: RewardSource, rows: list[dict], batch: StepBatch, n: int, turns: list[dict] | None = None
) -> StepBatch:
    """The batch with its scores and token scores: the outcome reward on each response's last token (verl's: the
    last one attended, which in a multi-turn response may be a tool's), 0 elsewhere."""
    return score_batch_with_fields(tokenizer, src, rows, batch, n, turns)[0]


def score_batch_with_fields(
    tokenizer, src: RewardSource, rows: list[dict], batch: StepBatch, n: int, turns: list[dict] | None = None
) -> tuple[StepBatch, list[dict]]:
    """score_batch's batch, and each sample's fields as verl 0.9's reward loop records them (score's, with
    number_as_acc): what DAPO's dynamic sampling may filter on."""
    scores, _, fields = score(tokenizer, src, rows, batch, n, turns, number_as_acc=True)
    scores = scores.to(batch.input_ids.device)
    attended = batch.attention_mask[:, batch.prompt_len :]
    last = (attended.sum(-1).long() - 1).clamp_min(0)
    token_scores = torch.zeros_like(batch.mask)
    token_scores[torch.arange(len(scores)), last] = scores
    return batch.replace(scores=scores, token_scores=token_scores), fields
