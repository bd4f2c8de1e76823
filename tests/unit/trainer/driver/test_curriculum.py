"""A curriculum sampler's batch (driver/curriculum.py): the training workers' kept samples as one batch in verl's
names, prompts left-padded and responses right-padded to the widest, each sample with its prompt's row fields."""

import pytest
import torch

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.driver.curriculum import check, step_data
from rlrig.trainer.errors import ConfigError

PAD = 9


def part(prompt: list[list[int]], response: list[list[int]], groups: list[int]) -> dict:
    """A worker's kept samples (TrainingWorker.kept_batch), masks from the tokens (0: padding)."""
    ids = torch.tensor([p + r for p, r in zip(prompt, response)])
    resp = torch.tensor(response)
    return {
        "prompt_len": len(prompt[0]),
        "input_ids": ids,
        "attention_mask": (ids != 0).long(),
        "response_mask": (resp != 0).long(),
        "prompts": torch.tensor(prompt),
        "responses": resp,
        "advantages": (resp != 0).float() * torch.tensor(groups).float()[:, None],
        "group": torch.tensor(groups),
    }


def test_the_workers_samples_make_one_batch_in_verls_names_with_their_rows():
    rows = [{"data_source": "a", "extra_info": {"i": 0}}, {"data_source": "b", "extra_info": {"i": 1}}]
    # worker 0: prompt 0's two samples, prompts of 2 columns, responses of 3; worker 1: prompt 1's, 1 and 2 columns
    # (balancing may have traded them: the group, not the worker, names the row)
    parts = [part([[0, 5], [0, 5]], [[1, 2, 0], [3, 0, 0]], [0, 0]), part([[6], [6]], [[4, 0], [4, 4]], [1, 1])]
    data = step_data([*parts, None], rows, step=3, pad_id=PAD)  # None: a sequence-parallel group's later rank
    b = data.batch
    assert len(data) == 4 and "group" not in b
    assert b["input_ids"].tolist() == [[0, 5, 1, 2, 0], [0, 5, 3, 0, 0], [PAD, 6, 4, 0, PAD], [PAD, 6, 4, 4, PAD]]
    assert b["attention_mask"].tolist() == [[0, 1, 1, 1, 0], [0, 1, 1, 0, 0], [0, 1, 1, 0, 0], [0, 1, 1, 1, 0]]
    assert b["prompts"].tolist() == [[0, 5], [0, 5], [PAD, 6], [PAD, 6]]
    assert b["responses"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 0, PAD], [4, 4, PAD]]
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 0, 0], [1, 0, 0], [1, 1, 0]]
    assert b["advantages"].tolist() == [[0, 0, 0], [0, 0, 0], [1, 0, 0], [1, 1, 0]]
    nt = data.non_tensor_batch
    assert nt["uid"].tolist() == ["3-0", "3-0", "3-1", "3-1"]  # one uid a prompt, as verl's
    assert nt["data_source"].tolist() == ["a", "a", "b", "b"]
    assert [e["i"] for e in nt["extra_info"]] == [0, 0, 1, 1]
    assert data.meta_info == {"global_steps": 3}


class Curriculum:
    name = "Curriculum"
    curriculum = True


@pytest.mark.parametrize(
    "mode, refused",
    [("fully_async_policy", True), ("one_step_off_policy", False), ("sync", False)],
)
def test_the_fully_async_mode_refuses_a_curriculum_sampler(mode, refused):
    cfg = parse_overrides([])
    cfg.trainer.async_mode = mode
    if refused:
        with pytest.raises(ConfigError, match="Curriculum is a curriculum sampler .* the fully async mode draws"):
            check(cfg, Curriculum())
    else:
        check(cfg, Curriculum())
