"""verl 0.9's rollout profiler with vLLM rolling out: vLLM's own torch profiler, configured as verl configures it,
records each generation of the named steps in the replica's folder, beside the actor's own window traces, which are
the files they are without it (one worker on CPU, about 2 minutes)."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

from rlrig.trainer.rollout.engines.recording import EngineRecording

RUN = """
import sys
from rlrig.trainer.driver.single_process import run_steps

run_steps(sys.argv[2:], 3)
"""
FAST = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.device=cpu",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.max_response_length=8",
        "data.max_prompt_length=48"]  # fmt: skip


def files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def test_vllm_records_the_generations_of_the_named_steps_beside_the_actors_windows(tmp_path):
    args = [
        *FAST,
        "actor_rollout_ref.rollout.name=vllm",
        "global_profiler.tool=torch",
        "global_profiler.steps=[2,3]",
        f"global_profiler.save_path={tmp_path}",
        "actor_rollout_ref.actor.profiler.enable=True",  # the actor's windows, as verl's example script asks
        "actor_rollout_ref.rollout.profiler.enable=True",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
        "actor_rollout_ref.rollout.profiler.tool_config.torch.contents=[cpu,shapes]",
    ]
    r = subprocess.run([sys.executable, "-c", RUN, "run", *args], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-4000:]
    written = files(tmp_path)
    traces = [f for f in written if f.startswith("agent_loop_rollout_replica_0/") and f.endswith(".pt.trace.json.gz")]
    assert len(traces) == 2, written  # one per recorded step's generation, from the engine's one rank
    actor = ["e2e/step2_prof_rank-0.json.gz", "e2e/step3_prof_rank-0.json.gz"]  # as without the rollout's
    assert [f for f in written if f.startswith("e2e/")] == actor
    # and vLLM's table of the ops it recorded, which it writes beside its traces
    assert set(written) - set(traces) - set(actor) <= {"agent_loop_rollout_replica_0/rank0.profiler_out.txt"}
    for f in traces:
        with gzip.open(tmp_path / f) as fh:
            events = json.load(fh)["traceEvents"]
        assert sum(e.get("cat") == "cpu_op" for e in events) > 100  # the engine's forward passes
        assert any("Input Dims" in e.get("args", {}) for e in events)  # contents=[cpu,shapes]: record_shapes
    for step in (2, 3):
        with gzip.open(tmp_path / f"e2e/step{step}_prof_rank-0.json.gz") as fh:
            marks = {e["name"] for e in json.load(fh)["traceEvents"] if e.get("cat") == "user_annotation"}
        assert "update_actor" in marks and "gen" not in marks  # the generation is the engine's trace


def test_vllm_takes_the_profiler_config_verl_builds():
    from vllm.config import ProfilerConfig

    parsed = ProfilerConfig(**EngineRecording("/tmp/x", 0, ("stack",), 2, 5).vllm_config())
    assert (parsed.profiler, parsed.torch_profiler_dir, parsed.delay_iterations, parsed.max_iterations) == (
        "torch",
        "/tmp/x",
        2,
        3,
    )
    assert parsed.torch_profiler_with_stack and not parsed.torch_profiler_record_shapes and parsed.ignore_frontend
