"""The installed Ray's version: too old refused before anything starts, newer than tested a warning."""

import os
import re
from pathlib import Path

import pytest

from rlrig.entrypoint import bootstrap, cli, doctor, lifecycle
from rlrig.entrypoint.preflight import inventory, rayversion
from tests.helpers.entrypoint_fakes import collector

PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"

VERSIONS = [
    # (id, version, status, words in the message)
    ("no token auth yet", "2.51.2", "fail", ["Ray 2.51.2", ">= 2.52", "pip install 'ray[default]>=2.52'"]),
    ("older line", "2.50.0", "fail", ["Ray 2.50.0", "RAY_AUTH_MODE=token"]),
    ("much older", "1.13.1", "fail", ["Ray 1.13.1"]),
    ("not installed", None, "fail", ["not installed", "pip install 'ray[default]>=2.52'"]),
    ("the minimum", "2.52.0", "pass", ["Ray 2.52.0", "2.52 to 2.60.x"]),
    ("a release candidate of the minimum", "2.52.0rc1", "pass", ["2.52.0rc1"]),
    ("between", "2.55.1", "pass", ["2.55.1"]),
    ("the tested line", "2.60.0", "pass", ["2.60.0"]),
    ("a patch of the tested line", "2.60.7", "pass", ["2.60.7"]),
    ("next line", "2.61.0", "warn", ["Ray 2.61.0 is newer", "2.52 to 2.60.x", "'ray[default]>=2.52,<2.61'"]),
    ("a dev build of the next line", "2.61.0.dev0", "warn", ["2.61.0.dev0"]),
    ("nightly", "3.0.0.dev0", "warn", ["3.0.0.dev0"]),
    ("unreadable", "custom", "warn", ["'custom'"]),
]


@pytest.mark.parametrize("version,status,words", [r[1:] for r in VERSIONS], ids=[r[0] for r in VERSIONS])
def test_verdict(version, status, words):
    got, message = rayversion.verdict(version)
    assert got == status, message
    for w in words:
        assert w in message, message


def test_pyproject_requires_what_the_check_allows():
    line = re.search(r'"(ray\[default\][^"]*)"', PYPROJECT.read_text()).group(1)
    assert line == rayversion.REQUIREMENT == "ray[default]>=2.52,<2.61"


@pytest.fixture
def ray_installed(monkeypatch, tmp_path):
    """A made-up machine, no launcher (one local node), a token, and the given installed Ray version."""
    monkeypatch.setattr(inventory, "collect", collector())
    monkeypatch.setattr(os, "environ", {"RLRIG_CLUSTER_TOKEN": "t" * 64})
    monkeypatch.chdir(tmp_path)  # no ./.env

    def install(version):
        monkeypatch.setattr(rayversion, "installed", lambda: version)

    return install


def test_doctor_fails_naming_both_versions_and_the_fix(ray_installed, capsys):
    ray_installed("2.51.2")
    found = bootstrap.inspect(os.environ, collect=collector())
    assert doctor.exit_code(found) == 1
    first = found.preflight.checks[0]
    assert (first.name, first.status) == ("ray", "fail")
    assert "Ray 2.51.2" in first.message and ">= 2.52" in first.message and "ray[default]>=2.52" in first.message
    assert found.checked and found.spec.head_address == "127.0.0.1"  # the rest of the report is still there
    assert cli.main(["doctor"]) == 1
    assert "[fail] ray: Ray 2.51.2 is installed" in capsys.readouterr().out


COMMANDS = [["run", "--", "true"], ["up"], ["train"]]


@pytest.mark.parametrize("argv", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_too_old_is_refused_in_one_line_before_anything_starts(ray_installed, monkeypatch, capsys, argv):
    ray_installed("2.51.2")

    def must_not_run(plan):
        raise AssertionError("the node was started with a Ray that has no token authentication")

    monkeypatch.setattr(lifecycle, "main", must_not_run)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("rlrig: error: Ray 2.51.2 is installed but rlrig needs Ray >= 2.52"), err
    assert "pip install 'ray[default]>=2.52'" in err[0]


@pytest.mark.parametrize("argv", COMMANDS, ids=[a[0] for a in COMMANDS])
def test_newer_than_tested_warns_once_and_goes_on(ray_installed, monkeypatch, capsys, argv):
    ray_installed("2.61.0")
    started = []
    monkeypatch.setattr(lifecycle, "main", lambda plan: started.append(plan) or 0)
    assert cli.main(argv) == 0
    assert len(started) == 1
    said = [line for line in capsys.readouterr().err.splitlines() if "Ray 2.61.0" in line]
    assert len(said) == 1 and said[0].startswith("rlrig: warn: ray: Ray 2.61.0 is newer"), said


CLIENTS = [["submit", "--", "true"], ["status"], ["down"]]


@pytest.mark.parametrize("argv", CLIENTS, ids=[a[0] for a in CLIENTS])
def test_clients_refuse_too_old_in_one_line(ray_installed, capsys, argv):
    ray_installed("2.51.2")
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Ray 2.51.2 is installed" in err[0], err
