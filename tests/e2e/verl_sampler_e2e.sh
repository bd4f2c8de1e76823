#!/usr/bin/env bash
# data.sampler against verl's own curriculum interface: verl from PyPI in a venv layered over .venv (as
# verl_dataset_e2e.sh), then `rlrig train` for three steps with a sampler built on verl's AbstractCurriculumSampler,
# as verl's test suite's RandomCurriculumSampler is (the class verl's curriculum scripts name): the sampler is drawn
# from, and its update gets verl's DataProto of each step's batch, read as a verl sampler reads it. Needs the PyPI
# index; about two minutes. Run from the repository root:
#   bash tests/e2e/verl_sampler_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. tests/e2e/verl_venv.sh
# verl 0.7.0: the last release with data.sampler and AbstractCurriculumSampler (0.8.0 dropped them), as at the commit
# rlrig follows (b178a3cd), with the tensordict it allows
make_verl_venv "$work" verl==0.7.0 tensordict==0.10.0
cat >"$work/curriculum.py" <<'PY'
import json
from pathlib import Path

import torch
from torch.utils.data import RandomSampler

from verl import DataProto
from verl.experimental.dataset.sampler import AbstractCurriculumSampler


class RandomCurriculumSampler(AbstractCurriculumSampler):
    """verl's tests/utils/dataset/test_create_rl_sampler_on_cpu.py's, writing down what update gets."""

    def __init__(self, data_source, data_config):
        g = torch.Generator()
        g.manual_seed(1)
        self.sampler = RandomSampler(data_source=data_source, generator=g)

    def __iter__(self):
        return self.sampler.__iter__()

    def __len__(self) -> int:
        return len(self.sampler)

    def update(self, batch) -> None:
        assert isinstance(batch, DataProto), type(batch)
        seen = {
            "samples": len(batch),
            "uids": len(set(batch.non_tensor_batch["uid"])),
            "score": float(batch.batch["token_level_scores"].sum(-1).mean()),
            "responses": list(batch.batch["responses"].shape),
            "step": batch.meta_info["global_steps"],
        }
        with open(Path(__file__).with_name("updates.jsonl"), "a") as f:
            f.write(json.dumps(seen) + "\n")
PY
# the venv's python runs the driver, where the sampler lives; Ray's command line comes from .venv
PATH="$work/venv/bin:$PWD/.venv/bin:$PATH" "$work/venv/bin/python" -m rlrig.entrypoint.cli train \
  "data.sampler.class_path=$work/curriculum.py" data.sampler.class_name=RandomCurriculumSampler \
  data.train_batch_size=8 actor_rollout_ref.actor.ppo_mini_batch_size=8 trainer.total_training_steps=3 \
  trainer.val_before_train=False trainer.test_freq=0 trainer.save_freq=0 "trainer.default_local_dir=$work/run" \
  >"$work/train.log" 2>&1 || { tail -40 "$work/train.log"; exit 1; }
"$work/venv/bin/python" - "$work" <<'PY'
import json
import pathlib
import sys

d = pathlib.Path(sys.argv[1])
updates = [json.loads(line) for line in (d / "updates.jsonl").read_text().splitlines()]
steps = [json.loads(line) for line in (d / "run" / "metrics.jsonl").read_text().splitlines()]
assert [u["step"] for u in updates] == [1, 2, 3], updates
assert all(u["uids"] == 8 and u["samples"] % 8 == 0 for u in updates), updates
for u, m in zip(updates, steps):
    assert abs(u["score"] - m["critic/score/mean"]) < 1e-6, (u, m["critic/score/mean"])
print(f"PASS: verl's DataProto handed to the curriculum sampler after each of {len(updates)} steps: {updates}")
PY
