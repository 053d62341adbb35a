"""A child process for tests/ha/test_ha_memory_bounds.py: HA streams that
report offset 0 and never read what the master ships.

    python tests/support/ha_idle_peers.py ADDRESS TOKEN_FILE COUNT PREFIX

Opens COUNT streams to the master at ADDRESS (slave names PREFIX0, PREFIX1,
...), each with a first report of offset 0, prints `ready` once every first
report is written, then reports 0 on each stream every 0.3 s, reading
nothing, until it is killed. A test that stops it (SIGSTOP) has a peer whose
socket is not read at all: what the master ships stays on the master's side.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

import grpc

from cluster.node.auth import read_token_file
from ha.transport.grpc_transport import GrpcConnector
from proto import ha_pb2

REPORT_EVERY_S = 0.3


async def _peer(address: str, token: str, name: str, opened: asyncio.Queue[str]) -> None:
    report = ha_pb2.Report(max_offset=0, slave=name, incarnation=f"idle-{name}")
    async with GrpcConnector().open(address, token) as call:
        await call.write(report)
        await opened.put(name)
        while True:
            await asyncio.sleep(REPORT_EVERY_S)
            try:
                await call.write(report)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError,
                    RuntimeError):
                return  # the master ended (or refused) the stream


async def main(address: str, token: str, count: int, prefix: str) -> None:
    opened: asyncio.Queue[str] = asyncio.Queue()
    peers = [asyncio.create_task(_peer(address, token, f"{prefix}{i}", opened))
             for i in range(count)]
    for _ in range(count):
        await opened.get()
    print("ready", flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*peers)
    await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    address, token_file, count, prefix = sys.argv[1:5]
    asyncio.run(main(address, read_token_file(token_file), int(count), prefix))
