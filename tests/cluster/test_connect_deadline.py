"""A slow connection handshake — a loaded machine, docker-proxy in front of
a compose node — must not fail a client's call while its own deadline
lasts. gRPC core takes "grpc.min_reconnect_backoff_ms" as the minimum time
one connection attempt may take up to the server's HTTP/2 SETTINGS frame;
the clients' fast-reconnect options once set it to a few ms, and a node
`up()` had just called reachable answered "connection attempt timed out
before receiving SETTINGS frame" (cluster/client/node_client.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from support.ha_helpers import running_cluster

from cluster.backends.procs import free_ports
from cluster.client.consumer import Consumer
from cluster.client.node_client import FAST_RECONNECT, NodeClient, make_message
from cluster.node.role import Role

# Well past the old 100 ms connect timeout; far inside a call's deadline.
HANDSHAKE_DELAY_S = 0.6
# Past the consumer's old connect timeout even at its longest backoff (1 s).
SLOW_HANDSHAKE_DELAY_S = 1.5


@contextmanager
def slow_first_bytes(target: str, delay_s: float = HANDSHAKE_DELAY_S) -> Iterator[str]:
    """A real TCP relay to `target` that holds the server's first bytes on
    each connection (its SETTINGS frame) for `delay_s`; its address."""
    (port,) = free_ports(1)
    loop = asyncio.new_event_loop()
    started = threading.Event()
    host, tport = target.rsplit(":", 1)

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter, delay: float) -> None:
        first = True
        try:
            while data := await r.read(65536):
                if first and delay:
                    await asyncio.sleep(delay)
                first = False
                w.write(data)
                await w.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            w.close()

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection(host, int(tport))
        await asyncio.gather(pipe(cr, uw, 0), pipe(ur, cw, delay_s))

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        started.set()
        async with server:
            with contextlib.suppress(asyncio.CancelledError):  # the teardown
                await server.serve_forever()

    thread = threading.Thread(target=lambda: loop.run_until_complete(main()), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        for task in asyncio.all_tasks(loop):
            loop.call_soon_threadsafe(task.cancel)
        thread.join(timeout=10)
        loop.close()


def test_a_slow_handshake_does_not_fail_a_fast_reconnect_client(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, slaves=0) as (b, tok), \
            slow_first_bytes(b.node("master").address) as slow:
        for _ in range(3):  # a new channel each time: a new handshake
            with NodeClient(slow, token=tok, timeout_s=10,
                            channel_options=FAST_RECONNECT) as c:
                assert c.status_dict()["name"] == "master"


def test_a_slow_handshake_does_not_fail_a_consumer(tmp_path: Path) -> None:
    with running_cluster(str(tmp_path), role=Role.ASYNC_MASTER, slaves=0) as (b, tok), \
            slow_first_bytes(b.node("master").address, SLOW_HANDSHAKE_DELAY_S) as slow:
        with NodeClient(b.node("master").address, token=tok, timeout_s=10) as direct:
            assert direct.send(make_message("t", b"x" * 10)).status == "PUT_OK"

        async def go() -> int:
            async with Consumer([slow], token=tok, group="g", topic="t",
                                commit_interval_ms=100) as c:
                return await c.run(lambda d: None, max_messages=1, idle_exit_s=8)
        assert asyncio.run(go()) == 1
