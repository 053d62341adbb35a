"""The simulated cluster's nodes open their stores without write buffers
zero-filled up front (chaos/sim/cluster.py): the same store and node code,
only less memory taken at every open (docs/performance-notes.md, "The
simulated cluster")."""

from __future__ import annotations

import random

from chaos.sim.cluster import SimCluster
from cluster.backends.interface import NodeSpec
from cluster.node.role import Role
from store.config import FlushMode
from store.sim import loop as sim_loop
from store.sim.loop import VirtualTimeLoop
from store.sim.memory_disk import DiskFaults


def test_a_sim_node_opens_its_store_with_one_write_buffer() -> None:
    async def main(loop: VirtualTimeLoop) -> int:
        master = NodeSpec(name="master", role=Role.ASYNC_MASTER, flush=FlushMode.ASYNC_FLUSH,
                          segment_size_bytes=8 << 20)
        c = SimCluster(loop, random.Random(1), master, (), DiskFaults(), on_crash=lambda _n: None)
        assert await c.start("master")
        node = c.nodes["master"].node
        assert node is not None and node.store is not None
        got = node.store.log._buffers.allocated  # `current` only: none zero-filled ahead
        await c.stop("master")
        return got

    assert sim_loop.run(main) == 1
