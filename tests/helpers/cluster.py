"""Plain names the integration tests share (their fixtures stay in tests/integration/conftest.py)."""

from tests.helpers import netns

TOKEN = "a" * 64
# the overrides of a two-node run of the embedded task small enough for one core per node, checkpointing every
# second step (the runs that stop and resume)
TWO_NODE_TRAIN = [
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "trainer.val_before_train=False",
    "trainer.test_freq=0",
    "trainer.save_freq=2",
    "trainer.nnodes=2",
    "trainer.n_gpus_per_node=1",
]


def dstack_env(ns: netns.Netns, i: int, run: str) -> dict[str, str]:
    return {
        "DSTACK_NODE_RANK": str(i),
        "DSTACK_NODES_NUM": str(ns.n),
        "DSTACK_MASTER_NODE_IP": ns.ip(0),
        "DSTACK_NODES_IPS": "\n".join(ns.ip(j) for j in range(ns.n)),
        "DSTACK_RUN_NAME": run,
    }
