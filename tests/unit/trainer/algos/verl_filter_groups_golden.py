"""Writes verl_filter_groups_golden.json beside it: which groups verl 0.9's DAPO filter drops, on seeded random
metric values, which test_filter_groups.py compares rlrig's kept_groups with (the test needs neither verl nor its
source).

verl VERL_RELEASE (verl_source.py), from its wheel unpacked at a folder given on the command line:

    .venv/bin/python tests/unit/trainer/algos/verl_filter_groups_golden.py /tmp/verlwheel

verl keeps the recipe's rule inline in its DAPO trainer's loop; its one function of it is the v1 replay buffer's
ReplayBuffer._dapo_filtered_keys (verl/trainer/ppo/v1/replay_buffer.py), whose module needs transfer_queue. The
method is cut out by name with ast and executed by hand: `self` holds the finished groups, and a stand-in for
transfer_queue's kv_batch_get hands it each sample's metric, as a reward_extra_info field (metric "acc") or as the
canonical reward's token scores (metric "reward", which it sums).
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: its neighbour
from verl_source import wheel_show, write_fixture  # noqa: E402

OUT = Path(__file__).with_name("verl_filter_groups_golden.json")
REPLAY_BUFFER = "verl/trainer/ppo/v1/replay_buffer.py"


def load_filter(root: str):
    """ReplayBuffer._dapo_filtered_keys of the wheel at `root`, as a plain function of (self, partition_id)."""
    source = wheel_show(root, REPLAY_BUFFER)
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ReplayBuffer")
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "_dapo_filtered_keys")
    ns = {"np": np, "Counter": Counter, "defaultdict": defaultdict, "FILTER_GROUPS_REWARD_METRIC": "reward"}
    exec(textwrap.dedent(ast.get_source_segment(source, method)), ns)
    return ns


def dropped(ns: dict, metric: str, groups: list[list[float]]) -> list[int]:
    """The groups verl drops: their trajectories keyed `{uid}_{session}_{index}` as its replay buffer keys them."""
    keys = {f"u{g}_{s}_0": v for g, values in enumerate(groups) for s, v in enumerate(values)}

    def kv_batch_get(keys, partition_id, select_fields):
        if select_fields == ["rm_scores"]:
            return {"rm_scores": [torch.tensor([0.0, values_of[k]]) for k in keys]}
        return {"extra_fields": [{"reward_extra_info": {metric: values_of[k]}} for k in keys]}

    values_of = keys
    ns["tq"] = SimpleNamespace(kv_batch_get=kv_batch_get)
    me = SimpleNamespace(
        filter_groups_metric=metric,
        finished_keys={"train": {f"u{g}" for g in range(len(groups))}},
        partitions={"train": {k: {} for k in keys}},
        _dapo_classification_cache=defaultdict(dict),
    )
    uids, _ = ns["_dapo_filtered_keys"](me, "train")
    return sorted(int(u[1:]) for u in uids)


def cases(ns: dict) -> list[dict]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(40):
        n, metric = [1, 2, 3, 4, 8][i % 5], ["acc", "reward"][i % 2]
        levels = [0.0, 1.0] if i % 3 else [-1.0, 0.25, 0.5, 1.0]
        groups = rng.choice(levels, size=(int(rng.integers(1, 7)), n)).tolist()
        out.append({"metric": metric, "n": n, "values": sum(groups, []), "dropped": dropped(ns, metric, groups)})
    return out


if __name__ == "__main__":
    write_fixture(OUT, {"dapo_filtered_keys": cases(load_filter(sys.argv[1]))}, release=True)
