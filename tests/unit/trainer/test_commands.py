"""`rlrig data`: GSM8K from a local file needs nothing more; from the hub the `data` extra, said in one line."""

import builtins
import json

import pandas as pd
import pytest

from rlrig.entrypoint import cli

REAL_IMPORT = builtins.__import__


def import_failing(error: ImportError):
    def fake(name, *args, **kw):
        if name == "datasets":
            raise error
        return REAL_IMPORT(name, *args, **kw)

    return fake


def test_gsm8k_without_datasets_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(builtins, "__import__", import_failing(ModuleNotFoundError("no", name="datasets")))
    assert cli.main(["data", "gsm8k", "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlrig: error: downloading GSM8K needs the datasets package"), err
    assert "pip install 'rlrig[data]'" in err[0] and "--from FILE" in err[0]
    assert captured.out == "" and not (tmp_path / "out").exists()


def test_a_broken_datasets_install_shows_its_own_error(monkeypatch, tmp_path):
    broken = ModuleNotFoundError("No module named 'pyarrow._compute'", name="pyarrow._compute")
    monkeypatch.setattr(builtins, "__import__", import_failing(broken))
    with pytest.raises(ModuleNotFoundError, match="pyarrow._compute"):
        cli.main(["data", "gsm8k", "--out", str(tmp_path / "out")])


def test_gsm8k_from_a_local_file_needs_no_datasets(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(builtins, "__import__", import_failing(ModuleNotFoundError("no", name="datasets")))
    src = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(20)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert cli.main(["data", "gsm8k", "--from", str(src), "--out", str(tmp_path / "out")]) == 0
    train = pd.read_parquet(tmp_path / "out" / "train.parquet")
    assert len(train) + len(pd.read_parquet(tmp_path / "out" / "test.parquet")) == 20
    assert train.iloc[0]["reward_model"]["ground_truth"] == "3"  # rows[2]: the first tenth is the test split


def test_gsm8k_with_tools_writes_verls_multi_turn_schema_and_its_tool_config(tmp_path):
    """verl's examples/data_preprocess/gsm8k_tool_agent_loop.py's rows, and the answer-check tool they name."""
    from rlrig.trainer.agent.tools import load_tools

    src = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"} for i in range(20)]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert cli.main(["data", "gsm8k", "--tools", "--from", str(src), "--out", str(out)]) == 0
    row = pd.read_parquet(out / "train.parquet").iloc[0]
    assert row["agent_name"] == "tool_agent" and [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert (
        row["prompt"][1]["content"]
        == "What is 2 + 1? Let's think step by step and output the final answer after `####`."
    )
    assert row["extra_info"]["tools_kwargs"]["calc_gsm8k_reward"]["create_kwargs"]["ground_truth"] == "3"
    assert row["extra_info"]["interaction_kwargs"]["ground_truth"] == "3"
    assert list(load_tools(str(out / "gsm8k_tool_config.yaml"))) == ["calc_gsm8k_reward"]
    assert cli.main(["data", "arithmetic", "--tools", "--out", str(tmp_path / "no")]) == 2
