#!/usr/bin/env bash
# A reward manager of your own beside verl 0.9.1: the unit tests' verl cases (verl's own NaiveRewardManager and gdpo,
# and a class importing verl only, given verl's DataProto), then `rlrig train` (hf, 2 steps) run by verl's Python
# with a class that imports verl only, whose scores must reach metrics.jsonl. VERL_PYTHON: a Python with verl 0.9.1
# beside rlrig (else one is made from PyPI as verl_dataset_e2e.sh makes it). About two minutes. Run from the
# repository root:   VERL_PYTHON=/path/to/venv/bin/python bash tests/e2e/verl_reward_manager_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=${VERL_PYTHON:-}
if [ -z "$py" ]; then
  . tests/e2e/verl_venv.sh
  make_verl_venv "$work" verl==0.9.1 tensordict==0.10.0
  "$work/venv/bin/pip" install -q aiohttp
  py="$work/venv/bin/python"
fi
"$py" -m pytest -q -p no:cacheprovider tests/unit/trainer/reward/test_own_managers.py -k beside_verl | tee "$work/unit.txt"
grep -q "^3 passed" "$work/unit.txt"  # none skipped: verl imported
cat >"$work/verl_only.py" <<'PY'
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.reward_loop.reward_manager import register
from verl.experimental.reward_loop.reward_manager.base import RewardManagerBase
from verl.utils.reward_score import gsm8k


@register("verl_only_gsm8k")
class VerlOnly(RewardManagerBase):
    def __init__(self, config, tokenizer, compute_score, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.bonus = config.reward.reward_kwargs.get("bonus", 0.0)

    async def run_single(self, data: DataProto) -> dict:
        assert isinstance(data, DataProto) and isinstance(data.batch, TensorDict) and len(data) == 1
        item = data[0]
        ids = item.batch["responses"]
        n = int(item.batch["attention_mask"][-ids.shape[-1]:].sum())
        text = await self.loop.run_in_executor(None, lambda: self.tokenizer.decode(ids[:n], skip_special_tokens=True))
        acc = gsm8k.compute_score(text, item.non_tensor_batch["reward_model"]["ground_truth"])
        return {"reward_score": acc + self.bonus, "reward_extra_info": {"acc": acc, "length": n}}
PY
"$py" -m rlrig.entrypoint.cli data arithmetic --out "$work/data" --train-size 8 --test-size 4
"$py" -m rlrig.entrypoint.cli train "data.train_files=$work/data/train.parquet" "data.val_files=$work/data/test.parquet" \
  actor_rollout_ref.rollout.name=hf data.train_batch_size=4 actor_rollout_ref.actor.ppo_mini_batch_size=4 \
  trainer.val_before_train=False trainer.total_training_steps=2 trainer.test_freq=2 trainer.save_freq=-1 \
  "trainer.default_local_dir=$work/run" "reward.reward_manager.module.path=$work/verl_only.py" \
  reward.reward_manager.name=verl_only_gsm8k +reward_model.reward_kwargs.bonus=2.0 >"$work/train.log" 2>&1 ||
  { tail -20 "$work/train.log"; exit 1; }
"$py" - "$work/run/metrics.jsonl" <<'PY'
import json
import sys

rows = [json.loads(line) for line in open(sys.argv[1])]
scores = [r["critic/score/min"] for r in rows]
assert len(rows) == 2 and min(scores) >= 2.0, scores  # every score is the class's: its accuracy plus the bonus
assert rows[-1]["val-aux/rlrig/arithmetic/length/mean@1"] > 0, rows[-1]
print("a reward manager importing verl only scored the run:", [r["critic/score/mean"] for r in rows])
PY
