"""data.custom_cls (verl's): a data set class of the user's own, loaded from a file or an installed module, built with
verl's arguments and read item by item into rows that tokenize as any others."""

import textwrap

import pytest

from rlrig.trainer.config.overrides import parse_overrides
from rlrig.trainer.data.datasets import load_rows
from rlrig.trainer.embedded.tiny_model import build_tokenizer
from rlrig.trainer.errors import ConfigError

# A class written as verl's retool recipe writes one: it reads the files itself, rewrites each question into the chat
# messages (verl's raw_prompt), marks the rows for the tool agent, and keeps verl's placeholder tensor.
VERL_STYLE = """
import json
import torch
from torch.utils.data import Dataset


class AdditionSet(Dataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.rows = [json.loads(line) for f in data_files for line in open(f)]
        if max_samples > 0:
            self.rows = self.rows[:max_samples]
        self.suffix = config.get("suffix_from_config", " =")
        self.prompt_key = config.prompt_key
        self.tokenizer = tokenizer

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        r = self.rows[i]
        return {
            "raw_prompt": [{"role": "user", "content": r["q"] + self.suffix}],
            "dummy_tensor": torch.tensor([0], dtype=torch.uint8),
            "data_source": "arithmetic",
            "reward_model": {"ground_truth": r["a"]},
            "extra_info": {"index": i},
            "agent_name": "tool_agent",
        }
"""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "my_data.py").write_text(VERL_STYLE)
    (tmp_path / "train.jsonl").write_text('{"q": "1+2", "a": "3"}\n{"q": "2+2", "a": "4"}\n')
    (tmp_path / "test.jsonl").write_text('{"q": "3+3", "a": "6"}\n')
    return tmp_path


def cfg_for(tmp_path, *extra):
    return parse_overrides(
        [
            f"data.train_files={tmp_path}/train.jsonl",
            f"data.val_files={tmp_path}/test.jsonl",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            *extra,
        ]
    )


@pytest.mark.parametrize("path", ["{dir}/my_data.py", "file://{dir}/my_data.py"])
def test_a_verl_style_class_gives_the_rows_their_prompts_and_fields(files, path):
    cfg = cfg_for(files, f"data.custom_cls.path={path.format(dir=files)}", "data.custom_cls.name=AdditionSet")
    tok = build_tokenizer()
    train, val = load_rows(cfg, tok, None)
    assert [r["prompt"][0]["content"] for r in train] == ["1+2 =", "2+2 ="]
    assert all(r["prompt"][0]["role"] == "user" and len(r["prompt"]) == 1 for r in train)
    assert [r["reward_model"]["ground_truth"] for r in train + val] == ["3", "4", "6"]
    assert all(r["agent_name"] == "tool_agent" and "dummy_tensor" not in r and "raw_prompt" not in r for r in train)
    # tokenized as a parquet row with the same prompt is
    expected = tok.apply_chat_template(train[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert train[0]["input_ids"] == tok(expected, add_special_tokens=False)["input_ids"]


def test_an_installed_module_is_named_with_pkg(files, monkeypatch):
    monkeypatch.syspath_prepend(str(files))
    cfg = cfg_for(files, "data.custom_cls.path=pkg://my_data", "data.custom_cls.name=AdditionSet")
    train, _ = load_rows(cfg, build_tokenizer(), None)
    assert len(train) == 2


@pytest.mark.parametrize(
    "path, name, source, says",
    [
        ("{dir}/none.py", "AdditionSet", None, "data.custom_cls.path/name: {dir}/none.py does not exist"),
        ("{dir}/my_data.py", "Missing", None, "has no Missing"),
        ("{dir}/my_data.py", "", None, "the name is not"),
        ("pkg://no_such_module_here", "X", None, "cannot be imported (No module named 'no_such_module_here')"),
        ("{dir}/bad.py", "X", "import verl_not_here\n", "imports what is not installed"),
        ("{dir}/bad.py", "X", "class X:\n    pass\n", "must be a subclass of torch.utils.data.Dataset"),
        (
            "{dir}/bad.py",
            "X",
            "from torch.utils.data import Dataset\nclass X(Dataset):\n"
            "    def __init__(self, **kw): pass\n    def __len__(self): return 1\n"
            "    def __getitem__(self, i): return [1]\n",
            "items must be dicts",
        ),
        (
            "{dir}/bad.py",
            "X",
            "from torch.utils.data import Dataset\nclass X(Dataset):\n"
            "    def __init__(self, **kw): pass\n    def __len__(self): return 1\n"
            "    def __getitem__(self, i): return {'data_source': 'x'}\n",
            "neither raw_prompt",
        ),
    ],
)
def test_what_cannot_be_used_is_named_in_one_line(files, path, name, source, says):
    if source is not None:
        (files / "bad.py").write_text(textwrap.dedent(source))
    cfg = cfg_for(files, f"data.custom_cls.path={path.format(dir=files)}", f"data.custom_cls.name={name}")
    with pytest.raises(ConfigError) as e:
        load_rows(cfg, build_tokenizer(), None)
    assert says.format(dir=files) in str(e.value) and "\n" not in str(e.value)
