"""verl's rollout traces (actor_rollout_ref.rollout.trace.*, its utils/rollout_trace.py) to MLflow: one trace per
sample, written by the process that runs the agent loop once the sample ends.

A trace is laid out as verl's: a root span `agent_loop` tagged with the step, the prompt's index, the sample's number
among the prompt's rollout.n (rollout_n), validate and the experiment; under it the loop's `run` (the prompt's
messages in, the sample's token ids out); under that a span per generation (its context's token ids in, the new
tokens out), per tool-call parse and per tool call (the arguments in, the text and reward out). token2text adds the
decoded text beside the token ids. The store is verl's (trainer/mlflow_store.py).

The loop moves in waves (agent/loop.py), so spans are recorded with their own times and written when the sample
ends, not as a call stack while it runs."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from .. import mlflow_store


@dataclass
class Span:
    name: str
    start_ns: int
    end_ns: int
    inputs: dict
    outputs: dict


@dataclass
class SampleTrace:
    """One sample's spans so far, and which sample it is."""

    sample_index: int
    rollout_n: int
    spans: list[Span] = field(default_factory=list)
    inputs: dict = field(default_factory=dict)  # what the loop's run span shows went in
    start_ns: int = field(default_factory=time.time_ns)


class Tracer:
    """The traces of one worker's agent loop; `on` is False without a backend, and then it records nothing."""

    def __init__(self, cfg, tokenizer):
        t = cfg.actor_rollout_ref.rollout.trace
        self.on = t.backend == "mlflow"
        self.token2text, self.most = t.token2text, t.max_samples_per_step_per_worker
        self.tok, self.project, self.experiment = tokenizer, cfg.trainer.project_name, cfg.trainer.experiment_name
        self.step, self.validate = -1, False
        self._client = self._experiment_id = None
        self.rng = random.Random()  # its own: tracing leaves the run's seeded random draws as they would be

    def at(self, step: int, validate: bool = False) -> None:
        """The step (and whether validation) the next samples are for."""
        self.step, self.validate = step, validate

    def chosen(self, rows: list[dict], n: int) -> list[SampleTrace | None]:
        """Each sample's trace, or None for one left untraced: every sample, or all n of at most
        max_samples_per_step_per_worker prompts picked at random, as verl picks them for each call."""
        if not self.on:
            return [None] * (len(rows) * n)
        indices = [(r.get("extra_info") or {}).get("index", i) for i, r in enumerate(rows)]
        picked = set(indices)
        if self.most is not None and self.most < len(picked):
            picked = set(self.rng.sample(sorted(picked), self.most))
        return [SampleTrace(index, k) if index in picked else None for index in indices for k in range(n)]

    def text(self, ids: list[int]) -> dict:
        return {"text": self.tok.decode(ids)} if self.token2text else {}

    def generation(self, trace: SampleTrace, start: int, end: int, context: list[int], new: list[int]) -> None:
        out = {"token_ids": new, **self.text(new)}
        trace.spans.append(Span("generate", start, end, {"prompt_ids": context, **self.text(context)}, out))

    def parse(self, trace: SampleTrace, start: int, end: int, turn: list[int], calls: list) -> None:
        found = [{"name": c.name, "arguments": c.arguments} for c in calls]
        trace.spans.append(Span("extract_tool_calls", start, end, {"responses_ids": turn}, {"calls": found}))

    def tool_call(self, trace: SampleTrace, tool, call, start: int, end: int, text: str, reward) -> None:
        name = f"{type(tool).__name__}.execute" if tool is not None else f"{call.name}.execute"
        inputs = {"name": call.name, "parameters": call.arguments}
        trace.spans.append(Span(name, start, end, inputs, {"text": text, "reward": reward}))

    def write(self, samples: list[tuple[SampleTrace | None, str, dict]]) -> None:
        """Each ended sample's trace: (its trace, the loop's name, what came out), written and flushed."""
        done = [s for s in samples if s[0] is not None]
        if not done:
            return
        import mlflow

        client = self._connect()
        for trace, loop_name, outputs in done:
            end = time.time_ns()
            tags = {
                "step": str(self.step),
                "sample_index": str(trace.sample_index),
                "rollout_n": str(trace.rollout_n),
                "validate": str(self.validate),
                "experiment_name": self.experiment,
            }
            root = client.start_trace(
                "agent_loop", tags=tags, experiment_id=self._experiment_id, start_time_ns=trace.start_ns
            )
            run = client.start_span(
                f"{loop_name}.run",
                trace_id=root.trace_id,
                parent_id=root.span_id,
                inputs=trace.inputs,
                start_time_ns=trace.start_ns,
            )
            for s in trace.spans:
                span = client.start_span(
                    s.name, trace_id=root.trace_id, parent_id=run.span_id, inputs=s.inputs, start_time_ns=s.start_ns
                )
                client.end_span(root.trace_id, span.span_id, outputs=s.outputs, end_time_ns=s.end_ns)
            client.end_span(root.trace_id, run.span_id, outputs=outputs, end_time_ns=end)
            client.end_trace(root.trace_id, end_time_ns=end)
        mlflow.flush_trace_async_logging()  # a worker ended by the driver must not take its queued traces along

    def _connect(self):
        if self._client is None:
            import mlflow

            self._experiment_id = mlflow_store.experiment_id(self.project)
            self._client = mlflow.MlflowClient()
        return self._client
