"""An engine's routed experts on their way to training (rollout.enable_rollout_routing_replay): laid out as the
tokens are in the batch, -1 where the engine recorded none (padding, the last token it never read), and kept in
place when batches are merged (a rollout pool's workers), concatenated (dynamic sampling), cut by row and when the
agent loop's turns make a trajectory."""

import numpy as np
import pytest
import torch

from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.driver.dynamic_sampling import concat
from rlrig.trainer.driver.rollout_pool import merge
from rlrig.trainer.rollout.engines.base import left_pad_to, pack_responses, routed_layout

PAD, EOS, L, K = 0, 1, 2, 2


def _routing(tokens: int, start: int) -> np.ndarray:
    """vLLM's routed experts of a sequence: [tokens, layers, k], numbered so each token's are its own."""
    return (start + np.arange(tokens * L * K).reshape(tokens, L, K)) % 100


def test_pack_responses_lays_the_routing_out_as_the_tokens_are():
    prompts, responses = [[5, 6, 7], [8]], [[3, 4, EOS], [9, 9, 9, 9, 9]]
    routed = [_routing(3 + 3 - 1, 0), _routing(1 + 5 - 1, 50)]  # every token but the last
    ro = pack_responses(prompts, 1, responses, [[0.0] * len(r) for r in responses], 4, PAD, EOS, routed)
    assert ro.routed_experts.shape == (2, 3 + 4, L, K) and ro.routed_experts.dtype == torch.int16
    # row 0: no left padding; 5 tokens routed, the EOS (last) and the pad after it not
    assert torch.equal(ro.routed_experts[0, :5], torch.as_tensor(routed[0]).to(torch.int16))
    assert (ro.routed_experts[0, 5:] == -1).all()
    # row 1: two pads on the left; its response cut to 4 tokens (max_new), whose routing it keeps
    assert (ro.routed_experts[1, :2] == -1).all()
    assert torch.equal(ro.routed_experts[1, 2:], torch.as_tensor(routed[1][:5]).to(torch.int16))
    assert torch.equal(ro.routing_of(1), ro.routed_experts[1, 2:])
    assert torch.equal(ro.rows(slice(1, 2)).routed_experts, ro.routed_experts[1:])
    assert pack_responses(prompts, 1, responses, None, 4, PAD, EOS).routed_experts is None


def test_merging_and_concatenating_keep_each_tokens_routing():
    a = pack_responses([[5, 6, 7]], 1, [[3, EOS]], None, 3, PAD, EOS, [_routing(4, 0)])
    b = pack_responses([[8]], 1, [[4, 4, 4]], None, 3, PAD, EOS, [_routing(3, 30)])
    merged = merge([a, b], PAD)
    assert merged.routed_experts.shape == (2, 6, L, K)
    for part, row in ((a, 0), (b, 1)):
        assert torch.equal(merged.routing_of(row), part.routing_of(0))
    both = concat([StepBatch.from_rollout(a, 1), StepBatch.from_rollout(b, 1)], PAD)
    assert torch.equal(both.routed_experts, merged.routed_experts)
    wide = left_pad_to(b.routed_experts, 5, -1)  # the token columns widened, not the layers or experts
    assert wide.shape == (1, 5, L, K) and torch.equal(wide[:, 1:], b.routed_experts) and (wide[:, 0] == -1).all()


def test_the_agent_loop_keeps_a_trajectorys_latest_routing_over_all_its_tokens():
    from rlrig.trainer.agent.loop import Trajectory, pack

    t = Trajectory(prompt=[5, 6], messages=[], tools_kwargs={}, multi_turn=True)
    t.add([3, 4], model=True)
    t.add([7], model=False)  # a tool's reply
    t.add([9, EOS], model=True)
    t.routed = torch.as_tensor(_routing(6, 0)).to(torch.int16)  # the last turn read all but its last token
    ro = pack([t], 8, PAD, with_logps=False)
    assert torch.equal(ro.routing_of(0)[:6], t.routed) and (ro.routing_of(0)[6:] == -1).all()
    assert (
        pack([Trajectory(prompt=[5], messages=[], tools_kwargs={}, multi_turn=False)], 2, PAD, False).routed_experts
        is None
    )


def test_the_engines_are_asked_for_routed_experts_only_with_the_key():
    from rlrig.trainer.config.schema import RolloutConfig
    from rlrig.trainer.rollout.engines import vllm_engine

    on, off = RolloutConfig(enable_rollout_routing_replay=True), RolloutConfig()
    assert vllm_engine.engine_kwargs(on, "/m", 64, "cuda", 0)["enable_return_routed_experts"] is True
    assert "enable_return_routed_experts" not in vllm_engine.engine_kwargs(off, "/m", 64, "cuda", 0)


def test_a_tool_rounds_sample_carries_its_last_turns_routing_over_every_token(tmp_path):
    """Two turns and a tool's reply between them: the sample's routing is what the last turn's call returned for the
    whole context (prompt, first turn, tool reply) and its own tokens, each token's where it sits."""
    from rlrig.trainer.agent.rollout import AgentRollout
    from tests.unit.trainer.agent.test_loop import EOS as END
    from tests.unit.trainer.agent.test_loop import TOK, Cfg, ScriptedEngine, call, row

    def routing(seq: list[int]) -> np.ndarray:  # each token's experts from its id and place; none for the last
        return np.array([[[(t + j) % 8, (t + j + 1) % 8]] * L for j, t in enumerate(seq)][:-1])

    class RoutedEngine(ScriptedEngine):
        def generate(self, prompts, n, sampling=None, sync_follows=False, max_new=None, hold=False):
            ro = super().generate(prompts, n, sampling, sync_follows, max_new, hold)
            seqs = [ro.input_ids[i][ro.attention_mask[i].bool()].tolist() for i in range(len(ro.input_ids))]
            ro.routed_experts = routed_layout([routing(s) for s in seqs], ro.attention_mask)
            return ro

    tools = tmp_path / "tools.yaml"
    tools.write_text(
        "tools:\n  - class_name: rlrig.trainer.agent.tools.calculator.CalculatorTool\n    config: {type: native}\n"
    )
    engine = RoutedEngine({"12*3=": call("12*3"), "</tool_response>": f"#### 36{END}"})
    ro, _ = AgentRollout(engine, TOK, Cfg(str(tools))).generate([row("12*3=")], 1)
    assert len(engine.calls) == 2  # the tool round: two turns
    seq = ro.input_ids[0][ro.attention_mask[0].bool()].tolist()
    got = ro.routing_of(0)
    assert torch.equal(got[:-1], torch.as_tensor(routing(seq)).to(torch.int16)) and (got[-1] == -1).all()


def _prompt_widths_differ(rank: int):
    """Rank 0's prompts are three tokens wide, rank 1's one: exchange widens them to one width."""
    prompts = [[5, 6, 7]] if rank == 0 else [[8]]
    routed = [_routing(len(prompts[0]) + 2, 10 * rank)]
    return StepBatch.from_rollout(pack_responses(prompts, 1, [[3, 3, 3]], None, 3, PAD, EOS, routed), 1, rank)


def _exchange_worker(rank, world, out_dir):
    from rlrig.trainer.batch.exchange import exchange

    swapped = exchange(_prompt_widths_differ(rank), torch.tensor([1 - rank]), PAD)  # each takes the other's sample
    torch.save({"routing": swapped.routed_experts, "attention": swapped.attention_mask}, f"{out_dir}/{rank}.pt")


@pytest.mark.process
def test_samples_moved_between_workers_keep_each_tokens_routing(tmp_path):
    from tests.helpers import gloo_ranks

    gloo_ranks.run(2, _exchange_worker, str(tmp_path))
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt")
        sent = _prompt_widths_differ(1 - rank)
        mine = got["routing"][0][got["attention"][0].bool()]
        assert got["routing"].dtype == torch.int16
        assert torch.equal(mine, sent.routed_experts[0][sent.attention_mask[0].bool()])
