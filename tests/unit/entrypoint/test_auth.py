"""Where the cluster token comes from, and when there must be one."""

import pytest

from rlrig.entrypoint.cluster.auth import ray_auth_env, resolve_token
from rlrig.entrypoint.errors import RigError

A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


@pytest.fixture
def files(tmp_path):
    """Token files by name: c.txt holds C, d.txt holds D, empty.txt nothing."""
    for name, text in (("c.txt", C + "\n"), ("d.txt", f"  {D}  "), ("empty.txt", "\n")):
        (tmp_path / name).write_text(text)
    return lambda name: str(tmp_path / name)


RESOLVED = [
    # (id, env (FILE:<name> = path of that file), nodes, token, source)
    ("rlrig value", {"RLRIG_CLUSTER_TOKEN": A}, 2, A, "RLRIG_CLUSTER_TOKEN"),
    ("value stripped", {"RLRIG_CLUSTER_TOKEN": f" {A}\n"}, 2, A, "RLRIG_CLUSTER_TOKEN"),
    ("rlrig file", {"RLRIG_CLUSTER_TOKEN_FILE": "FILE:c.txt"}, 2, C, "RLRIG_CLUSTER_TOKEN_FILE"),
    ("ray value", {"RAY_AUTH_TOKEN": B}, 2, B, "RAY_AUTH_TOKEN"),
    ("ray path, stripped", {"RAY_AUTH_TOKEN_PATH": "FILE:d.txt"}, 2, D, "RAY_AUTH_TOKEN_PATH"),
    (
        "rlrig value over everything",
        {
            "RLRIG_CLUSTER_TOKEN": A,
            "RLRIG_CLUSTER_TOKEN_FILE": "FILE:c.txt",
            "RAY_AUTH_TOKEN": B,
            "RAY_AUTH_TOKEN_PATH": "FILE:d.txt",
        },
        2,
        A,
        "RLRIG_CLUSTER_TOKEN",
    ),
    (
        "rlrig file over ray's",
        {"RLRIG_CLUSTER_TOKEN_FILE": "FILE:c.txt", "RAY_AUTH_TOKEN": B},
        2,
        C,
        "RLRIG_CLUSTER_TOKEN_FILE",
    ),
    ("ray value over ray path", {"RAY_AUTH_TOKEN": B, "RAY_AUTH_TOKEN_PATH": "FILE:d.txt"}, 2, B, "RAY_AUTH_TOKEN"),
    ("blank counts as unset", {"RLRIG_CLUSTER_TOKEN": "  ", "RAY_AUTH_TOKEN": B}, 2, B, "RAY_AUTH_TOKEN"),
    ("single node with a token uses it", {"RAY_AUTH_TOKEN": B}, 1, B, "RAY_AUTH_TOKEN"),
]


def with_files(env, files):
    return {k: files(v[5:]) if v.startswith("FILE:") else v for k, v in env.items()}


@pytest.mark.parametrize("env,nnodes,token,source", [r[1:] for r in RESOLVED], ids=[r[0] for r in RESOLVED])
def test_token_sources_and_precedence(files, env, nnodes, token, source):
    assert resolve_token(with_files(env, files), nnodes) == (token, source)


REFUSED = [
    (
        "multi-node without a token",
        {},
        2,
        "a 2-node cluster needs a shared token and none is set; export RLRIG_CLUSTER_TOKEN",
    ),
    (
        "unreadable file",
        {"RLRIG_CLUSTER_TOKEN_FILE": "/nonexistent/token"},
        1,
        "RLRIG_CLUSTER_TOKEN_FILE=/nonexistent/token cannot be read",
    ),
    ("empty file", {"RAY_AUTH_TOKEN_PATH": "FILE:empty.txt"}, 2, "RAY_AUTH_TOKEN_PATH="),
    (
        "a bad file is not skipped for a later source",
        {"RLRIG_CLUSTER_TOKEN_FILE": "/nonexistent/t", "RAY_AUTH_TOKEN": B},
        2,
        "cannot be read",
    ),
]


@pytest.mark.parametrize("env,nnodes,words", [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED])
def test_token_refused(files, env, nnodes, words):
    with pytest.raises(RigError) as e:
        resolve_token(with_files(env, files), nnodes)
    assert words in str(e.value)


def test_single_node_generates_a_fresh_token():
    (t1, source), (t2, _) = resolve_token({}, 1), resolve_token({}, 1)
    assert source == "generated (single node)" and t1 != t2 and len(t1) == 64 and int(t1, 16) >= 0


def test_ray_auth_env():
    assert ray_auth_env(A) == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": A}
