"""A rank that hangs twice on two namespace nodes: `rlrig status --json` read while it hangs shows its phase and
seconds; the first hang restarts the run (--max-restarts 2), the second stops it naming the node and both hangs.
About two minutes; outside CI. Needs root. Run it from the repository root as
    .venv/bin/python -m tests.e2e.watchdog_twice_e2e
(pytest on this one file; its default collection, and so CI, leaves it out: the name does not start with test_)."""

import sys

import pytest

from tests.integration.conftest import cluster_hosts as cluster_hosts  # the namespace hosts fixture, used by name
from tests.integration.test_watchdog import test_a_hung_rank_is_named_with_its_stack_and_the_run_ends as hung


def test_a_rank_that_hangs_twice_is_restarted_once_then_stopped_named(cluster_hosts, tmp_path):
    # 20 s: time to read `rlrig status` while it hangs
    hung(cluster_hosts, tmp_path, "1:gen:3,1:gen:4", "gen", 2, 20)


if __name__ == "__main__":  # python -m tests.e2e.NAME [pytest options]: pytest on this file
    sys.exit(pytest.main(["-q", __file__, *sys.argv[1:]]))
