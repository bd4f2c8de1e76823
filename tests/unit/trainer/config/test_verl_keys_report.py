"""verl_keys_table/generate.py: a release's generated config written from its wheel (pip stands in for PyPI here, no
network), and the report of how rlrig takes each of its keys: none of the reference release's, nor of the b178a3c
table's, is unknown."""

import pathlib
import subprocess
import zipfile

import pytest
import yaml

from .verl_keys_table import generate
from .verl_keys_table.generate import (
    COMMIT_NAME,
    GENERATED,
    REFERENCE,
    commit_table_report,
    fetch,
    flatten,
    header,
    main,
    release_file,
    release_report,
    vendor,
)
from .verl_keys_table.report import CLASSES, classify


@pytest.fixture(scope="module")
def reference():
    return release_report(release_file(REFERENCE), REFERENCE)


def test_the_reference_release_has_no_unknown_key(reference):
    assert reference.unknown == []
    keys = dict(flatten(yaml.safe_load(release_file(REFERENCE).read_text())))
    assert reference.by_key.keys() == keys.keys()
    assert sum(reference.count(c) for c in CLASSES) == len(keys) > 850
    assert reference.count("refused") == 0  # verl's defaults ask for nothing rlrig refuses
    assert all(reference.count(c) > 0 for c in CLASSES[:5]), reference.text()


def test_the_commit_table_has_no_unknown_key():
    table = commit_table_report()
    assert table.name == f"verl {COMMIT_NAME}" and len(table.by_key) > 600
    assert table.unknown == []
    assert table.count("refused") > 50  # verl b178a3c's generated config holds its Megatron sections


@pytest.mark.parametrize(
    "key,default,cls",
    [
        ("actor_rollout_ref.actor.optim.lr", "1e-06", "implemented"),
        ("critic.fsdp.param_offload", "False", "implemented"),  # verl 0.9's place of critic.model.fsdp_config
        ("reward.reward_kwargs.max_resp_len", "null", "implemented"),  # an item of a mapping rlrig takes whole
        ("trainer.use_v1", "True", "default-only"),
        ("actor_rollout_ref.actor.optim._target_", "verl.workers.config.FSDPOptimizerConfig", "default-only"),
        ("data.use_shm", "False", "no-effect"),
        ("actor_rollout_ref.rollout.mode", "async", "no-effect"),
        ("actor_rollout_ref.actor.rollout_n", "${oc.select:actor_rollout_ref.rollout.n,1}", "interpolated"),
        ("reward.reward_model.rollout.name", "???", "not-given"),
        ("reward_model.enable", "null", "not-given"),
        ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size", "1", "refused"),
        ("trainer.use_v1", "False", "refused"),
        ("actor_rollout_ref.actor.no_such_key", "1", "unknown"),
        ("trainer.nnode", None, "implemented"),  # an older name from verl's examples, with no default in the table
        ("actor_rollout_ref.rollout.no_such_key", None, "unknown"),
    ],
)
def test_each_class_as_rlrig_answers_the_key_alone(key, default, cls):
    assert classify(key, default) == cls


def _wheel(tmp_path: pathlib.Path, body: str | None, name: str = "verl-9.9.9-py3-none-any.whl") -> pathlib.Path:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as whl:
        whl.writestr("verl/__init__.py", "")
        if body is not None:
            whl.writestr(GENERATED, body)
    return path


def test_vendor_copies_the_wheels_config_unchanged_under_a_header_naming_the_release(tmp_path):
    body = "# verl's own comment\ntrainer:\n  total_epochs: 30\n"
    out = vendor(_wheel(tmp_path, body), "9.9.9", tmp_path)
    assert out == release_file("9.9.9", tmp_path) == tmp_path / "verl_9.9.9_ppo_trainer.yaml"
    assert out.read_text() == header("9.9.9") + body
    assert out.read_text().startswith("# verl 9.9.9's verl/trainer/config/_generated_ppo_trainer.yaml")


def test_the_reference_file_is_what_vendor_writes_from_its_body(tmp_path):
    kept = release_file(REFERENCE).read_text()
    body = kept.removeprefix(header(REFERENCE))
    assert body != kept
    assert vendor(_wheel(tmp_path, body), REFERENCE, tmp_path).read_text() == kept


def test_a_wheel_without_the_generated_config_is_refused_naming_the_file(tmp_path):
    with pytest.raises(SystemExit, match=f"has no {GENERATED}"):
        vendor(_wheel(tmp_path, None), "9.9.9", tmp_path)


def test_fetch_asks_pip_for_that_release_alone(tmp_path, monkeypatch):
    asked = []

    def pip(command, **kwargs):
        asked.append(command)
        _wheel(tmp_path, "trainer: {}\n")
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(generate.subprocess, "run", pip)
    assert fetch("9.9.9", tmp_path) == tmp_path / "verl-9.9.9-py3-none-any.whl"
    (command,) = asked
    assert command[1:5] == ["-m", "pip", "download", "--no-deps"] and command[-1] == "verl==9.9.9"
    assert command[command.index("--dest") + 1] == str(tmp_path)


def test_a_release_pip_cannot_find_stops_with_pips_reason(tmp_path, monkeypatch):
    says = "ERROR: No matching distribution found for verl==9.9.9"
    monkeypatch.setattr(
        generate.subprocess, "run", lambda command, **kw: subprocess.CompletedProcess(command, 1, "", f"x\n{says}\n")
    )
    with pytest.raises(SystemExit, match=f"pip download --no-deps verl==9.9.9: {says}"):
        fetch("9.9.9", tmp_path)


def test_release_writes_the_file_and_lists_the_keys_rlrig_does_not_know(tmp_path, monkeypatch, capsys):
    body = "trainer:\n  total_epochs: 30\n  rlrig_unheard_of: 1\n"
    monkeypatch.setattr(generate, "fetch", lambda release, into: _wheel(into, body))
    assert main(["--release", "9.9.9", "--out", str(tmp_path)]) == 1
    assert release_file("9.9.9", tmp_path).read_text() == header("9.9.9") + body
    out = capsys.readouterr().out
    assert "verl 9.9.9: 2 leaf keys" in out and "implemented      1" in out and "unknown          1" in out
    assert out.rstrip().endswith("    trainer.rlrig_unheard_of")


def test_report_of_the_reference_release_says_no_key_is_unknown(capsys):
    assert main(["--report", REFERENCE]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"verl {REFERENCE}: ") and out.rstrip().endswith("unknown          0")


def test_report_of_a_table_not_kept_names_those_kept():
    with pytest.raises(SystemExit, match=f"kept: {COMMIT_NAME}, .*{REFERENCE}"):
        main(["--report", "0.0.1"])
