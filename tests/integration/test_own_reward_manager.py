"""A reward manager of your own for real (`rlrig train`, the hf engine, the embedded arithmetic task): its
run_single's scores are the run's scores and its reward_extra_info reaches the validation metrics as verl logs them;
one that raises ends the run in one line naming it."""

from pathlib import Path

import pytest

from tests.integration.test_train import metrics, rlrig

pytestmark = pytest.mark.integration

# written as for verl 0.9: only the import line differs from verl's
MANAGER = """
from rlrig.trainer.reward.verl_api import DataProto, RewardManagerBase, register


@register("constant_plus_length")
class ConstantPlusLength(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.base = float(config.reward.reward_kwargs.base)

    async def run_single(self, data: DataProto) -> dict:
        item = data[-1:][0]
        if self.base < 0:
            raise ValueError("the base is negative")
        response_ids = item.batch["responses"]
        length = int(item.batch["attention_mask"][-response_ids.shape[-1]:].sum())
        text = self.tokenizer.decode(response_ids[:length], skip_special_tokens=True)
        acc = self.compute_score(
            data_source=item.non_tensor_batch["data_source"],
            solution_str=text,
            ground_truth=item.non_tensor_batch["reward_model"]["ground_truth"],
            extra_info=item.non_tensor_batch["extra_info"],
        )
        return {"reward_score": self.base, "reward_extra_info": {"length": length, "acc": acc}}
"""


def train(tmp_path: Path, base: float, steps: int):
    (tmp_path / "manager.py").write_text(MANAGER)
    data = tmp_path / "data"  # four validation prompts: the run is about the scores, not the task
    made = rlrig("data", "arithmetic", "--out", str(data), "--train-size", "8", "--test-size", "4")
    assert made.returncode == 0, made.stderr
    return rlrig(
        "train",
        f"data.train_files={data / 'train.parquet'}",
        f"data.val_files={data / 'test.parquet'}",
        "actor_rollout_ref.rollout.name=hf",
        "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "trainer.val_before_train=False",
        f"trainer.total_training_steps={steps}",
        f"trainer.test_freq={steps}",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        f"reward.reward_manager.module.path={tmp_path / 'manager.py'}",
        "reward.reward_manager.name=constant_plus_length",
        f"+reward_model.reward_kwargs.base={base}",
        timeout=300,
    )


def test_a_reward_manager_of_your_own_scores_the_run_and_its_extra_info_is_logged(tmp_path):
    r = train(tmp_path, 3.0, 1)
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = metrics(tmp_path / "run")
    assert row["critic/score/mean"] == row["critic/score/min"] == 3.0
    # verl's validation metrics: acc, where the reward returns it, is the core variable; its other fields are aux
    assert row["val-aux/rlrig/arithmetic/reward/mean@1"] == 3.0
    assert row["val-aux/rlrig/arithmetic/length/mean@1"] > 0
    assert 0.0 <= row["val-core/rlrig/arithmetic/acc/mean@1"] <= 1.0


# long: CI checks the line in one process (tests/unit/trainer/reward/test_own_managers.py)
@pytest.mark.long
def test_a_reward_manager_that_raises_ends_the_run_in_one_line(tmp_path):
    r = train(tmp_path, -1.0, 1)
    assert r.returncode == 2, r.stderr[-3000:]
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("rlrig: error:")]
    assert line.startswith("rlrig: error: reward manager constant_plus_length (rlrig_extern_"), line
    words = f".ConstantPlusLength): run_single raised ValueError: the base is negative at {tmp_path}/manager.py:"
    assert words in line, line
