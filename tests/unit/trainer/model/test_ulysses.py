"""Ulysses sequence parallelism (model/ulysses.py): two ranks in a real Gloo group, each holding half of the packed
columns, give the same log-probs, entropy, sum of squared probabilities, values and gradients as one process holding
all of them; and the pieces (the all-to-all's layouts, the packed causal mask, head counts) by hand."""

import os

import pytest
import torch
import torch.distributed as dist

from rlrig.trainer.model import ulysses
from tests.helpers import gloo_ranks

pytestmark = pytest.mark.process

# (heads, kv heads): kv split over the ranks, and fewer kv heads than ranks (each repeated)
SHAPES = [(4, 2), (4, 1)]


def _model(heads: int, kv: int, value_head: bool = False, window: int | None = None, checkpointing: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=64,
        attn_implementation="sdpa",
        num_labels=1,
        use_sliding_window=window is not None,
        sliding_window=window,
        max_window_layers=0,
        classifier_dropout=0.0,
        attention_dropout=0.0,
    )
    model = (Qwen2ForTokenClassification if value_head else Qwen2ForCausalLM)(cfg).eval()  # no dropout draws
    if checkpointing:  # it acts in training mode only: the recompute runs inside backward, after the forward
        from rlrig.trainer.model.build import set_checkpointing

        set_checkpointing(model, True)
        model.train()
    return model


def _batch():
    """Left-padded prompts (width 4) and right-padded responses (width 5) of different lengths."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 40, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[0, :2] = 0  # a shorter prompt
    mask[1, 7:] = 0  # a shorter response
    mask[2, :1] = 0
    mask[2, 6:] = 0
    return ids * mask, mask, 4


def _outputs(model, sp, heads, kv, value_head):
    from rlrig.trainer.model.forward import ForwardOptions, token_logprobs, token_outputs, values

    ids, mask, prompt_len = _batch()
    if value_head:
        v = values(model, ids, mask, prompt_len, remove_padding=True, sp=sp)
        loss = (v * torch.linspace(0.5, 1.5, v.numel()).view_as(v)).sum()
        outs = {"values": v}
    else:
        logp, ent = token_logprobs(
            model, ids, mask, prompt_len, ForwardOptions(with_entropy=True, remove_padding=True, sp=sp)
        )
        loss = (logp * torch.linspace(0.5, 1.5, logp.numel()).view_as(logp)).sum() - 0.1 * ent.sum()
        with torch.no_grad():  # the optimal token baseline's no-grad pass
            spp = token_outputs(
                model, ids, mask, prompt_len, ForwardOptions(remove_padding=True, sp=sp, with_sum_pi_squared=True)
            )[2]
        outs = {"logp": logp, "ent": ent, "sum_pi_squared": spp}
    loss.backward()
    return {k: t.detach() for k, t in outs.items()}, {n: p.grad.clone() for n, p in model.named_parameters()}


def _rank(rank, world, out_dir, heads, kv, value_head, window, checkpointing):
    sp = ulysses.make_groups(rank, world, world)
    outs, grads = _outputs(_model(heads, kv, value_head, window, checkpointing), sp, heads, kv, value_head)
    for g in grads.values():  # what DDP does over the world: each rank holds sp x its share; the mean is the whole
        dist.all_reduce(g)
        g /= world
    torch.save({"outs": outs, "grads": grads}, os.path.join(out_dir, f"{rank}.pt"))


@pytest.mark.parametrize(
    "heads, kv, value_head, window, checkpointing",
    [
        (4, 2, False, None, False),
        (4, 1, False, None, False),
        (4, 2, True, None, False),
        (4, 2, False, 3, False),
        (4, 2, False, None, True),  # gradient checkpointing: the recompute attends over the group again
        (4, 2, True, None, True),
    ],
)
def test_two_ranks_equal_one_in_outputs_and_gradients(tmp_path, heads, kv, value_head, window, checkpointing):
    args = (heads, kv, value_head, window, checkpointing)
    gloo_ranks.run(2, _rank, str(tmp_path), *args)
    want_outs, want_grads = _outputs(_model(*args), None, heads, kv, value_head)
    for r in range(2):
        got = torch.load(tmp_path / f"{r}.pt")
        for k, t in want_outs.items():
            torch.testing.assert_close(got["outs"][k], t, atol=1e-5, rtol=1e-5)
        for name, g in want_grads.items():
            torch.testing.assert_close(got["grads"][name], g, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_causal_mask_by_hand():
    # two packed sequences [0 1 2] [0 1] and a sliding window of 2 (a query sees itself and the one before)
    pos = torch.tensor([[0, 1, 2, 0, 1]])
    full = ulysses.packed_causal_mask(pos, None)[0, 0].int().tolist()
    assert full == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 1, 0], [0, 0, 0, 1, 1]]
    windowed = ulysses.packed_causal_mask(pos, 2)[0, 0].int().tolist()
    assert windowed[2] == [0, 1, 1, 0, 0]


def test_local_positions_pick_this_ranks_columns():
    # [2 rows, width 4] split over 2 ranks: rank 1 holds columns 2, 3; flat 3 -> (0, 3) -> local 0 * 2 + 1
    sp = ulysses.SeqParallel(None, 2, 1)
    mine, local = ulysses.local_positions(torch.tensor([1, 3, 6, 4]), 4, sp)
    assert mine.tolist() == [False, True, True, False] and local.tolist() == [1, 2]


@pytest.mark.parametrize(
    "heads, kv, size, refused",
    [(28, 4, 2, None), (28, 4, 4, None), (28, 4, 8, "28 attention heads"), (32, 2, 4, None), (24, 3, 2, "3 key-value")],
)
def test_head_counts(heads, kv, size, refused):
    from types import SimpleNamespace

    why = ulysses.head_refusal(SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv), size)
    assert (why is None) if refused is None else (refused in why)


def test_a_model_whose_heads_do_not_split_is_refused_before_any_worker_starts():
    # the embedded model has 2 attention heads: 4 ranks cannot each take a whole one
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.embedded.tiny_model import ensure_tiny_model
    from rlrig.trainer.rollout.engines import engine_class
    from rlrig.trainer.workers.start_checks import start_refusal

    path = ensure_tiny_model()
    base = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.model.use_remove_padding=True", "trainer.device=cpu"]
    four = parse_overrides([*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4"])
    engine = engine_class(four.actor_rollout_ref.rollout.name)  # as the worker chooses it
    why = start_refusal(four, path, "cpu", engine)
    assert why == (
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4: the model's 2 attention heads do not split over "
        "ulysses_sequence_parallel_size=4"
    )
    two = parse_overrides([*base, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"])
    assert start_refusal(two, path, "cpu", engine) is None
    eager = parse_overrides(
        [
            *base,
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        ]
    )
    assert "attn_implementation=eager (override_config) cannot attend" in start_refusal(eager, path, "cpu", engine)


SP2 = "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"
PACKED = ["trainer.n_gpus_per_node=4", "actor_rollout_ref.model.use_remove_padding=True"]


@pytest.mark.parametrize(
    "extra, refusal",
    [
        ([SP2], None),
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"], "does not divide the 4 workers"),
        ([SP2, "actor_rollout_ref.model.use_remove_padding=False"], "set actor_rollout_ref.model.use_remove_padding"),
        ([SP2, "algorithm.adv_estimator=gae", "critic.ulysses_sequence_parallel_size=2"], "critic.model.use_remove"),
        ([SP2, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4"], "set it to 1 or 2"),
        ([SP2, "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1"], None),  # whole sequences on pooled samples
        (
            [
                "critic.ulysses_sequence_parallel_size=2",
                "critic.model.use_remove_padding=True",
                "algorithm.adv_estimator=gae",
            ],
            "set it to 1 or 1",  # the critic runs on the actor's grouping
        ),
        (
            [
                SP2,
                "actor_rollout_ref.actor.use_kl_loss=True",
                "actor_rollout_ref.ref.enable_resource_pool=True",
                "actor_rollout_ref.ref.nnodes=1",
                "actor_rollout_ref.ref.n_gpus_per_node=1",
            ],
            "in a pool of its own is not in rlrig",
        ),
        ([SP2, "algorithm.adv_estimator=gae", "algorithm.use_pf_ppo=True"], "PF-PPO's resampling"),
        # the mini batch is split over the 2 groups, not the 4 workers (verl's dp = world / sp)
        ([SP2, "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"], None),
        (["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"], "cannot be split over 4"),
        ([SP2, "actor_rollout_ref.actor.ulysses_sequence_parallel_size=0"], "must be at least 1"),
    ],
)
def test_sequence_parallel_config(extra, refusal):
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.errors import ConfigError

    if refusal is None:
        parse_overrides([*PACKED, *extra])
        return
    with pytest.raises(ConfigError, match=refusal.replace("(", r"\(")):
        parse_overrides([*PACKED, *extra])


def test_token_budgets_and_mini_batches_are_per_group():
    # verl: ppo_max_token_len_per_gpu x sp for a group's micro batches; the mini batch over world / sp groups
    from rlrig.trainer.config.overrides import parse_overrides
    from rlrig.trainer.model.micro_batches import per_worker_mini_batch, token_budgets

    cfg = parse_overrides(
        [
            *PACKED,
            SP2,
            "actor_rollout_ref.actor.use_dynamic_bsz=True",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        ]
    )
    budgets = token_budgets(cfg)
    assert budgets["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == 8192
    assert budgets["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"] == 8192  # the reference follows the actor
    a = cfg.actor_rollout_ref
    assert per_worker_mini_batch(cfg, 4) == a.actor.ppo_mini_batch_size * a.rollout.n // 2
