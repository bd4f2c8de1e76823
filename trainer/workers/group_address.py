"""Where a process group's rank 0 listens, asked as a Ray task in rank 0's bundle before its workers exist. A module
of its own, importing Ray and nothing of the model: the task runs in whichever idle worker process Ray has, and
importing the workers' module there would cost seconds of every run's start-up."""

from __future__ import annotations

from rlrig.entrypoint.cluster.ports import kernel_free_port


def node_address() -> tuple[str, int]:
    """This node's address as Ray knows it, and a port the kernel has free on it."""
    import ray

    return ray.util.get_node_ip_address(), kernel_free_port()
