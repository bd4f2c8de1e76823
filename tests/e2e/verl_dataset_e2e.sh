#!/usr/bin/env bash
# data.custom_cls against verl's own data set class: verl from PyPI (no dependencies of its own beyond what its data
# set imports) in a venv layered over .venv, then the embedded arithmetic rows read once as parquet and once through
# pkg://verl.utils.dataset.rl_dataset RLHFDataset: the same rows, prompts and token ids. Needs the PyPI index; about
# a minute. Run from the repository root:
#   bash tests/e2e/verl_dataset_e2e.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
. tests/e2e/verl_venv.sh
make_verl_venv "$work" verl tensordict
"$work/venv/bin/python" - "$work" <<'PY'
import pathlib
import sys

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.data.datasets import arithmetic_rows, load_rows, write_parquet
from rlrig.trainer.embedded.tiny_model import build_tokenizer

d = pathlib.Path(sys.argv[1])
write_parquet(arithmetic_rows(8, "train", 1), d / "train.parquet")
write_parquet(arithmetic_rows(4, "test", 2), d / "test.parquet")
base = [f"data.train_files={d}/train.parquet", f"data.val_files={d}/test.parquet", "data.train_batch_size=1"]
base += ["actor_rollout_ref.actor.ppo_mini_batch_size=1"]
verl = ["data.custom_cls.path=pkg://verl.utils.dataset.rl_dataset", "data.custom_cls.name=RLHFDataset"]
tok = build_tokenizer()
plain, via = load_rows(parse_overrides(base), tok), load_rows(parse_overrides(base + verl), tok)
for a, b in zip(plain, via):
    assert len(a) == len(b), (len(a), len(b))
    for x, y in zip(a, b):
        assert x["input_ids"] == y["input_ids"] and x["prompt"] == y["prompt"], (x, y)
        assert x["reward_model"] == y["reward_model"] and x["data_source"] == y["data_source"]
print(f"PASS: {len(via[0])} training and {len(via[1])} validation rows through verl's RLHFDataset, as read from parquet")
PY
