"""The fabric check's probe on the Ray path: one Ray actor per node (driver.py starts them), its end of every pair
and of the all-reduce, over NCCL where every node has a GPU or plain TCP otherwise (links.py), and its GPUs' health
read before it touches a GPU."""

from __future__ import annotations

import time
from datetime import timedelta

from ..cluster.ports import kernel_free_port
from ..detect.addresses import format_hostport
from ..preflight import gpu_health
from . import links
from .protocol import TRANSFER_TIMEOUT, WARMUP_TIMEOUT, error_text, pair_side, transfer_error
from .verdict import median

JOIN_TIMEOUT = 30.0  # actors started (GPU nodes' import torch) and the process group formed


class Probe:
    """Runs as a Ray actor on one node: its end of every transfer, and its GPUs' health."""

    def __init__(self, torch_now: bool = True):
        # before this process touches a GPU: its own CUDA context is not memory another process holds
        self.gpus, self.gpu_probe = gpu_health.read_gpus()
        if torch_now:  # a GPU node, which measures over NCCL if every node has a GPU: seconds of CPU, begun at once
            import torch.distributed  # noqa: F401
        self.ready_at = time.time()
        self.server = None  # TCP: this probe's listener (links.listener)

    def ready(self) -> float:
        """When this probe was ready to measure (wall clock): the report shows it against the cluster's forming."""
        return self.ready_at

    def address(self) -> tuple[str, int]:
        """Rank 0's under NCCL: where the group's TCP rendezvous listens (this node's IP and a port free here)."""
        import ray

        return ray.util.get_node_ip_address(), kernel_free_port()

    def listen(self) -> tuple[str, int]:
        """TCP: this probe's listener, where rank 0 takes each pair and every rank its ring neighbour."""
        import ray

        ip = ray.util.get_node_ip_address()
        self.server = links.listener(ip)
        return ip, self.server.getsockname()[1]

    def join(self, master, rank: int, world: int, backend: str, peers: list | None = None) -> bool:
        """Into the check: NCCL, a torch.distributed group with its rendezvous at `master`; TCP, the listeners of
        every rank (`peers`), connected to pair by pair."""
        self.rank, self.world, self.backend, self.peers = rank, world, backend, peers
        if backend == "tcp":
            return True
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        # NCCL on the GPU Ray shows the actor; Gloo on the CPU only where tests drive the torch path without a GPU
        self.device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{format_hostport(*master)}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=JOIN_TIMEOUT),
        )
        return True

    def _link(self, peer: int, nbytes: int, lead: bool, timeout: float):
        if self.backend != "tcp":
            return links.TorchLink(peer, nbytes, self.device)
        sock = links.accept(self.server, timeout) if lead else links.connect(self.peers[peer], timeout)
        return links.TcpLink(sock, nbytes)

    def pair(self, peer: int, nbytes: int, lead: bool) -> dict:
        """This node's side of a pair with `peer` (pair_side); `lead` on rank 0."""
        link = None
        try:
            link = self._link(peer, nbytes, lead, WARMUP_TIMEOUT)
            return pair_side(link, lead)
        except Exception as e:  # no link at all: as pair_side says a broken one
            return {"error": transfer_error(e, "the round trip with rank 0", WARMUP_TIMEOUT)}
        finally:
            if link is not None:
                link.close()

    def allreduce(self, nbytes: int, iters: int) -> dict:
        try:
            if self.backend == "tcp":
                nxt = self.peers[(self.rank + 1) % self.world]
                args = (self.world, nbytes, iters, WARMUP_TIMEOUT, TRANSFER_TIMEOUT)
                seconds = links.ring_allreduce(
                    lambda t: links.accept(self.server, t), lambda t: links.connect(nxt, t), *args
                )
                return {"seconds": median(seconds)}
            import torch
            import torch.distributed as dist

            t = torch.ones(nbytes // 4, dtype=torch.float32, device=self.device)
            # warm-up: NCCL builds its rings here
            links.torch_wait(dist.all_reduce(t, async_op=True), self.device, WARMUP_TIMEOUT)
            times = []
            for _ in range(iters):
                t0 = time.perf_counter()
                links.torch_wait(dist.all_reduce(t, async_op=True), self.device, TRANSFER_TIMEOUT)
                times.append(time.perf_counter() - t0)
            return {"seconds": median(times)}
        except Exception as e:
            return {"error": error_text(e)}

    def health(self) -> dict:
        """This node's GPU readings, taken as this probe started."""
        return {"gpus": self.gpus, "gpu_probe": self.gpu_probe}
