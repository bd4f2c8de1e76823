import os
import shutil
import sys
import tempfile

import pytest

from tests.helpers import netns
from tests.helpers.cluster import TOKEN
from tests.helpers.nodeproc import NodeProc


@pytest.fixture
def cluster_hosts():
    """Factory: cluster_hosts(n) -> Netns with n hosts; removed at the end of the test."""
    why = netns.available()
    if why:
        pytest.skip(f"integration needs network namespaces: {why}")
    made, procs = [], []
    # Short on purpose: Ray's socket paths below the temp dir must stay under 107 bytes.
    ray_tmp = tempfile.mkdtemp(prefix="rlt", dir="/tmp")

    def make(n: int) -> netns.Netns:
        ns = netns.Netns(n, subnet=213 + len(made)).__enter__()
        made.append(ns)
        return ns

    def start(ns: netns.Netns, i: int, env: dict[str, str], args: list[str]) -> NodeProc:
        full = {**os.environ, "RLRIG_CLUSTER_TOKEN": TOKEN, "RAY_TMPDIR": ray_tmp, "PYTHONUNBUFFERED": "1", **env}
        full.pop("RAY_ADDRESS", None)
        p = NodeProc(ns.prefix(i) + [sys.executable, "-m", "rlrig.entrypoint.cli", *args], full)
        procs.append(p)
        return p

    make.start = start
    make.ray_tmp = ray_tmp  # the nodes' RAY_TMPDIR: their Ray logs are below it
    yield make
    for p in procs:
        p.kill()
    for ns in made:
        ns.__exit__(None, None, None)
    shutil.rmtree(ray_tmp, ignore_errors=True)


def _slurm(n: int):
    from tests.helpers import slurm

    why = slurm.available()
    if why:
        pytest.skip(f"a real Slurm needs: {why}")
    with slurm.Slurm(n) as s:
        yield s


@pytest.fixture
def slurm_cluster():
    """A real two-node Slurm on namespace hosts; skips only where Slurm cannot be started here."""
    yield from _slurm(2)


@pytest.fixture
def slurm_three():
    """The same with a third node: a spare for a two-node run."""
    yield from _slurm(3)
