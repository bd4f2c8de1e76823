"""The environment every node and Ray worker gets: the head's .env file plus RLRIG_ENV_* variables."""

import pytest

from rlrig.entrypoint.detect.clusterenv import cluster_env, default_env_file
from rlrig.entrypoint.errors import RigError

ROWS = [
    # (id, .env text or None, process env, cluster env)
    ("nothing", None, {"PATH": "/bin"}, {}),
    ("prefix stripped", None, {"RLRIG_ENV_VLLM_USE_V1": "1", "OTHER": "x"}, {"VLLM_USE_V1": "1"}),
    ("bare prefix ignored", None, {"RLRIG_ENV_": "x"}, {}),
    ("empty value kept", None, {"RLRIG_ENV_EMPTY": ""}, {"EMPTY": ""}),
    ("file", "A=1\n# comment\nexport B='two words'\n", {}, {"A": "1", "B": "two words"}),
    ("key without value skipped", "A=1\nJUST_A_KEY\n", {}, {"A": "1"}),
    ("variable beats file", "A=file\nB=file\n", {"RLRIG_ENV_A": "var"}, {"A": "var", "B": "file"}),
    ("per-node settings stay on their node", "RLRIG_RESOURCES='{\"h100\": 1}'\nA=1\n", {}, {"A": "1"}),
]


@pytest.mark.parametrize("text,env,expected", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_cluster_env(tmp_path, text, env, expected):
    path = None
    if text is not None:
        path = tmp_path / "x.env"
        path.write_text(text)
    assert cluster_env(env, str(path) if path else None) == expected


def test_missing_env_file_is_bad_input(tmp_path):
    with pytest.raises(RigError, match="--env-file .* does not exist"):
        cluster_env({}, str(tmp_path / "absent.env"))


def test_default_env_file(tmp_path):
    assert default_env_file(tmp_path) is None
    (tmp_path / ".env").write_text("A=1\n")
    assert default_env_file(tmp_path) == str(tmp_path / ".env")
