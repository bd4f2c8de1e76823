"""The driver's side of DAPO's dynamic sampling: generation batches drawn until data.train_batch_size prompts' groups
are kept, the batch cut to exactly that many and shared over the workers, the limit's error in verl's words."""

import pytest
import torch

from rlrig.trainer.batch.step_batch import StepBatch
from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver.dynamic_sampling import BatchFiller, concat, generation_metrics
from rlrig.trainer.errors import ConfigError
from rlrig.trainer.workers.step.dynamic_sampling import Generated

PAD, N = 0, 2


def config(train: int, gen: int, limit: int = 0, metric: str = "acc"):
    return parse_overrides(
        [
            f"data.train_batch_size={train}",
            f"data.gen_batch_size={gen}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={train}",
            f"actor_rollout_ref.rollout.n={N}",
            "algorithm.filter_groups.enable=True",
            f"algorithm.filter_groups.metric={metric}",
            f"algorithm.filter_groups.max_num_gen_batches={limit}",
        ]
    )


def generated(rows: list[dict]) -> Generated:
    """N samples of each row: the prompt is the row's id repeated `width` times (so prompts differ in width), the
    responses [id, sample]; each sample's acc from the row's `accs`."""
    prompts = [[r["id"]] * r.get("width", 1) for r in rows for _ in range(N)]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p + [r, j] for (p, r, j) in _samples(rows, prompts)])
    mask = (torch.arange(width + 2)[None] >= torch.tensor([width - len(p) for p in prompts])[:, None]).long()
    scores = torch.tensor([float(a) for r in rows for a in r["accs"]])
    batch = StepBatch(
        ids, mask, torch.ones(len(ids), 2, dtype=torch.long), width, torch.arange(len(ids)) // N, scores=scores
    ).replace(token_scores=torch.stack([torch.zeros_like(scores), scores], 1))
    values = [{"acc": a} for r in rows for a in r["accs"]] if rows and "accs" in rows[0] else []
    return Generated(batch, [v.get("acc") for v in values], {"timing_s/gen": 1.0, "num_turns/max": len(rows)})


def _samples(rows, prompts):
    return [(prompts[i * N + j], r["id"], j) for i, r in enumerate(rows) for j in range(N)]


def filler(cfg, batches: list[list[dict]], workers: int = 2, drawn: list | None = None) -> BatchFiller:
    it = iter(batches)

    def draw():
        got = next(it, None)
        if drawn is not None and got is not None:
            drawn.append([r["id"] for r in got])
        return got

    return BatchFiller(cfg, PAD, workers, draw, lambda shares: [generated(s) for s in shares])


def row(i: int, *accs, width: int = 1) -> dict:
    return {"id": i, "accs": list(accs), "width": width}


SAME, MIXED = (1, 1), (0, 1)


@pytest.mark.parametrize(
    "train, gen, batches, kept_ids, gens, evicted, surplus",
    [
        # hand-worked: 2 of the first 4 kept, 3 of the next: 5 kept, cut to 4 (prompt 8 discarded)
        (
            4,
            4,
            [
                [row(1, *SAME), row(2, *MIXED), row(3, 0, 0), row(4, *MIXED)],
                [row(5, *MIXED), row(6, *MIXED), row(7, 1, 1), row(8, *MIXED)],
            ],
            [2, 4, 5, 6],
            2,
            3,
            1,
        ),
        # nothing dropped: one batch, as without the filter
        (2, 2, [[row(1, *MIXED), row(2, *MIXED)]], [1, 2], 1, 0, 0),
        # a generation batch smaller than the training batch: three of them
        (
            4,
            2,
            [[row(1, *MIXED), row(2, *MIXED)], [row(3, *SAME), row(4, *MIXED)], [row(5, *MIXED), row(6, *MIXED)]],
            [1, 2, 4, 5],
            3,
            1,
            1,
        ),
        # larger: one batch holds enough, its kept surplus discarded
        (2, 6, [[row(i, *MIXED) for i in range(1, 7)]], [1, 2], 1, 0, 4),
    ],
)
def test_generation_batches_fill_exactly_the_training_batch(train, gen, batches, kept_ids, gens, evicted, surplus):
    filled = filler(config(train, gen), batches).fill()
    assert [r["id"] for r in filled.rows] == kept_ids
    assert filled.metrics["train/num_gen_batches"] == gens
    assert filled.metrics["training/filter_groups/evicted_samples"] == evicted
    assert filled.metrics["training/filter_groups/discarded_surplus_samples"] == surplus
    assert filled.metrics["timing_s/gen"] == gens * 1.0  # summed over the generation batches
    assert len(filled.shares) == 2
    samples = torch.cat([s.input_ids[:, -2] for s in filled.shares]).tolist()
    assert samples == [i for i in kept_ids for _ in range(N)]  # each kept prompt's samples, whole, in order
    assert torch.cat([s.group for s in filled.shares]).tolist() == [g for g in range(train) for _ in range(N)]
    assert all(len(s) == train * N // 2 for s in filled.shares)


def test_prompts_of_different_widths_join_left_padded():
    batches = [[row(1, *MIXED, width=3), row(2, *SAME)], [row(3, *MIXED, width=1), row(4, *MIXED, width=2)]]
    filled = filler(config(2, 2), batches, workers=1).fill()
    b = filled.shares[0]
    assert b.prompt_len == 3
    assert b.input_ids[:, :3].tolist() == [[1, 1, 1], [1, 1, 1], [PAD, PAD, 3], [PAD, PAD, 3]]
    assert b.attention_mask[:, :3].tolist() == [[1, 1, 1]] * 2 + [[0, 0, 1]] * 2
    assert b.scores.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert b.token_scores[:, 1].tolist() == [0.0, 1.0, 0.0, 1.0]


def test_past_max_num_gen_batches_the_step_fails_in_verl_words():
    hard = [[row(2 * k + 1, *SAME), row(2 * k + 2, 0, 0)] for k in range(5)]
    with pytest.raises(ConfigError) as e:
        filler(config(2, 2, limit=3), hard).fill()
    assert str(e.value) == (
        "num_gen_batches=3 >= max_num_gen_batches=3. Generated too many. Please check if your data are too "
        "difficult. You could also try set max_num_gen_batches=0 to enable endless trials."
    )


def test_without_a_limit_it_draws_until_full_and_every_drawn_prompt_is_consumed():
    batches = [[row(2 * k + 1, *SAME), row(2 * k + 2, *SAME)] for k in range(6)] + [[row(13, *MIXED), row(14, *MIXED)]]
    drawn = []
    filled = filler(config(2, 2), batches, drawn=drawn).fill()
    assert filled.metrics["train/num_gen_batches"] == 7 and [r["id"] for r in filled.rows] == [13, 14]
    assert drawn == [[2 * k + 1, 2 * k + 2] for k in range(7)]


def test_the_data_running_out_before_the_batch_is_full_leaves_no_step():
    assert filler(config(2, 2), [[row(1, *SAME), row(2, *MIXED)]]).fill() is None


def test_a_metric_the_reward_function_did_not_return_is_one_line():
    cfg = config(2, 2, metric="pred")
    f = BatchFiller(
        cfg,
        PAD,
        2,
        lambda: [row(1, *MIXED), row(2, *MIXED)],
        lambda shares: [Generated(generated(s).batch, [None] * N, {}) for s in shares],
    )
    with pytest.raises(ConfigError, match=r"^algorithm.filter_groups.metric=pred: the reward function returned no "):
        f.fill()


def test_concat_pads_responses_on_the_right():
    a = StepBatch(
        torch.tensor([[5, 1, 2]]),
        torch.ones(1, 3, dtype=torch.long),
        torch.ones(1, 2, dtype=torch.long),
        1,
        torch.zeros(1),
    )
    b = StepBatch(
        torch.tensor([[6, 3]]),
        torch.ones(1, 2, dtype=torch.long),
        torch.ones(1, 1, dtype=torch.long),
        1,
        torch.zeros(1),
    )
    got = concat([a, b], PAD)
    assert got.input_ids.tolist() == [[5, 1, 2], [6, 3, PAD]]
    assert got.response_mask.tolist() == [[1, 1], [1, 0]]


def test_generation_metrics_sum_the_phases_and_combine_the_rest_by_rule():
    per_batch = [[{"timing_s/gen": 2.0, "num_turns/max": 1}, {"timing_s/gen": 3.0, "num_turns/max": 4}]] * 2
    assert generation_metrics(per_batch) == {"timing_s/gen": 6.0, "num_turns/max": 4}


def test_the_run_is_planned_in_generation_batches_and_ends_with_the_epochs():
    from types import SimpleNamespace

    from rlrig.trainer.data.sampler import Sampler
    from rlrig.trainer.driver.modes import DynamicSampling as Mode

    cfg = config(4, 8)
    cfg.trainer.total_epochs = 2
    sampler = Sampler(20, cfg.data.train_batch_size, 1, True)
    assert Mode.plan(cfg, sampler, 20) == (4, 4)  # 2 generation batches of 8 an epoch, as verl's data loader
    assert sampler.batch == 8
    prep = SimpleNamespace(cfg=cfg, pad_id=PAD, sampler=sampler, train_rows=[{"id": i} for i in range(20)])
    mode = Mode(prep, SimpleNamespace(training=[None, None]))
    drawn = []
    while (rows := mode.draw()) is not None:
        drawn.append((sampler.epoch, len(rows)))
    assert drawn == [(0, 8), (0, 8), (1, 8), (1, 8)] and mode.exhausted()
    with pytest.raises(ConfigError, match="^data.gen_batch_size=32 is larger than the 20 training prompts$"):
        Mode.plan(config(4, 32), Sampler(20, 4, 1, True), 20)
