"""The HA transport seam: the replication stream without a network stack.

The master serves each slave stream through a MasterStream (what its
servicer uses of a grpc.aio ServicerContext); the slave opens its stream
with an HAConnector and talks through a SlaveCall (what it uses of a
grpc.aio StreamStreamCall). The vocabulary is gRPC's, whichever twin
carries the bytes: grpc.StatusCode for how a stream ended, grpc.aio.EOF for
its end, grpc.aio.AbortError raised by abort(), grpc.aio.AioRpcError for a
call that failed.

Two twins:
- gRPC (production): the servicer context and the call themselves satisfy
  the protocols; GrpcConnector opens the channel and the call exactly as
  the slave always has.
- MemoryNetwork (tests, the simulation): streams are two FIFO queues on the
  event loop. Each message is delivered after `delay(message)` seconds of
  loop time (default 0: on the next loop iteration), never before a message
  written earlier on the same stream (a gRPC stream is FIFO). `partition`
  holds deliveries between two addresses until `heal`; `reset` ends every
  stream of an address (the master's handler is cancelled, the slave's next
  read fails UNAVAILABLE). No thread, no socket, no wall clock: on a
  VirtualTimeLoop (store/sim/loop.py) a run is reproducible; randomness,
  if any, comes from the `delay` the caller passes (one seeded generator).

The same network carries unary calls (a client's broker calls, a slave's
copy of its master's consumer offsets): `serve_calls` puts a gRPC servicer
(cluster/node/server.py's BrokerServicer) at an address and `stub` gives a
caller an object with the servicer's methods, awaited like a grpc.aio
stub's (`await stub.Pull(request, timeout=..., metadata=...)`). The
request and the response are serialized and parsed as on the wire, each
delivered after `delay`, held while the two addresses are partitioned; the
token is checked as the node's interceptor does; the call fails as a gRPC
one does: UNAVAILABLE when nothing serves the address or the server goes
(`unserve_calls`) before it answers, DEADLINE_EXCEEDED at `timeout`,
the servicer's abort() code otherwise. The gRPC twin is BrokerStub on a
grpc.aio channel (`grpc_stub`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, NoReturn, Protocol

import grpc

from proto import ha_pb2

EOF = grpc.aio.EOF
REPLICATE_METHOD = f"/{ha_pb2.DESCRIPTOR.services_by_name['HA'].full_name}/Replicate"


class MasterStream(Protocol):
    """The master's end of one replication stream."""

    async def read(self) -> Any:
        """The next ha_pb2.Report, or EOF when the slave closed its side."""
        ...

    async def write(self, message: bytes) -> None:
        """One encoded MasterMessage (ha/frames.py)."""
        ...

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        """End the stream with this status (raises grpc.aio.AbortError)."""
        ...

    def peer(self) -> str: ...

    def done(self) -> bool: ...

    def cancelled(self) -> bool: ...


class SlaveCall(Protocol):
    """The slave's end of one replication stream."""

    async def write(self, request: ha_pb2.Report) -> None: ...

    def read(self) -> Awaitable[Any]:
        """The next encoded MasterMessage (bytes), or EOF once the master
        ended the stream (then code() and details() say how)."""
        ...

    async def code(self) -> grpc.StatusCode: ...

    async def details(self) -> str: ...

    def cancel(self) -> bool: ...


class HAConnector(Protocol):
    def open(self, address: str, token: str) -> contextlib.AbstractAsyncContextManager[SlaveCall]:
        """Open a replication stream to the master at `address`; closing the
        context releases what the stream holds (the channel)."""
        ...


Handler = Callable[[MasterStream], Awaitable[None]]


class InProcessNetwork(Protocol):
    """What a node uses of a network that carries its streams and calls
    without a socket (the simulation's MemoryNetwork, ha/transport/memory.py):
    the node is given one instead of serving gRPC, and never imports the twin."""

    def serve(self, address: str, handler: Handler, *, token: str) -> None: ...

    def unserve(self, address: str) -> None: ...

    def serve_calls(self, address: str, servicer: Any, *, token: str) -> None: ...

    def unserve_calls(self, address: str) -> None: ...

    def stub(self, client: str, address: str) -> Any:
        """A stub with the broker servicer's methods, awaited like grpc.aio's."""
        ...

    def connector(self, address: str) -> HAConnector: ...
