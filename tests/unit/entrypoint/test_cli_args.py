"""`rlrig train`'s options may follow overrides (a Slurm recipe's own KEY=VALUE first, then the user's "$@"), and
anything else unknown is still refused."""

import pytest

from rlrig.entrypoint import cli


@pytest.mark.parametrize(
    "argv, restarts, overrides",
    [
        (["train", "a.b=1"], 0, ["a.b=1"]),
        (["train", "--max-restarts", "2", "a.b=1"], 2, ["a.b=1"]),
        (["train", "a.b=1", "--max-restarts", "1", "c.d=2", "e=3"], 1, ["a.b=1", "c.d=2", "e=3"]),
    ],
)
def test_train_options_go_before_or_among_the_overrides(monkeypatch, argv, restarts, overrides):
    seen = []
    monkeypatch.setattr(cli, "cmd_train", lambda args: seen.append(args) or 0)
    assert cli.main(argv) == 0
    assert (seen[0].max_restarts, seen[0].overrides) == (restarts, overrides)


@pytest.mark.parametrize("argv", [["train", "a.b=1", "--no-such-option"], ["token", "extra"]])
def test_unknown_arguments_are_still_refused(monkeypatch, capsys, argv):
    monkeypatch.setattr(cli, "cmd_train", lambda args: 0)
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
