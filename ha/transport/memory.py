"""MemoryNetwork: the transport seam's in-memory twin (ha/transport/streams.py
describes the seam). Replication streams and broker calls between addresses
on one event loop: FIFO queues with a delay, partitions, resets; no thread,
no socket, no wall clock."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn

import grpc

from ha.credentials import TOKEN_METADATA_KEY
from ha.transport.memory_calls import Aborted, MemoryStub, UnaryContext, rpc_error
from ha.transport.streams import EOF, Handler, SlaveCall
from proto import ha_pb2

# Deliveries are the network's: they run in no endpoint's context (a
# simulation that holds a paused node's callbacks holds none of them).
_WIRE = contextvars.Context()


class _Pipe:
    """One direction of a stream: FIFO, each message delivered `delay` after
    it was written but never before the one written before it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, net: MemoryNetwork,
                 src: str, dst: str) -> None:
        self._loop = loop
        self._net = net
        self.src, self.dst = src, dst
        self._in_flight: collections.deque[tuple[float, Any]] = collections.deque()
        self._inbox: collections.deque[Any] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_at = 0.0
        self.closed = False  # the writer's side ended: EOF after the inbox
        self.failure: BaseException | None = None  # raised by read() at once
        self.severed = False  # half_open(): the other end does not hear of it

    def send(self, msg: Any) -> None:
        at = max(self._last_at, self._loop.time() + max(0.0, self._net.delay(msg)))
        self._last_at = at
        self._in_flight.append((at, msg))
        self.pump()

    def close(self) -> None:
        self.send(EOF)

    def fail(self, exc: BaseException) -> None:
        self.failure = exc
        self._in_flight.clear()
        self._inbox.clear()
        self._wake()

    def pump(self) -> None:
        """Deliver what is due; wait for the next, unless partitioned."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._net.partitioned(self.src, self.dst):
            return  # held until heal() pumps again
        now = self._loop.time()
        while self._in_flight and self._in_flight[0][0] <= now:
            self._inbox.append(self._in_flight.popleft()[1])
            self._wake()
        if self._in_flight:
            self._timer = self._loop.call_at(self._in_flight[0][0], self.pump, context=_WIRE)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def receive(self) -> Any:
        while True:
            if self.failure is not None:
                raise self.failure
            if self._inbox:
                msg = self._inbox.popleft()
                if msg is EOF:
                    self.closed = True
                return msg
            if self.closed:
                return EOF
            self._waiter = self._loop.create_future()
            await self._waiter


class _MemoryServerStream:
    """The master's end (a MasterStream)."""

    def __init__(self, inbound: _Pipe, outbound: _Pipe, peer: str) -> None:
        self._in, self._out = inbound, outbound
        self._peer = peer
        self.status: tuple[grpc.StatusCode, str] = (grpc.StatusCode.OK, "")
        self.over = False
        self.was_cancelled = False

    async def read(self) -> Any:
        return await self._in.receive()

    async def write(self, message: bytes) -> None:
        if self.over:
            raise RuntimeError("write on a finished stream")
        self._out.send(message)
        await asyncio.sleep(0)  # a write yields, as a gRPC write does

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        self.status = (code, details)
        raise grpc.aio.AbortError(f"{code.name}: {details}")

    def peer(self) -> str:
        return self._peer

    def done(self) -> bool:
        return self.over

    def cancelled(self) -> bool:
        return self.was_cancelled


class _MemoryCall:
    """The slave's end (a SlaveCall)."""

    def __init__(self, outbound: _Pipe, inbound: _Pipe, server: _MemoryServerStream,
                 handler: asyncio.Task[None]) -> None:
        self._out, self._in = outbound, inbound
        self._server = server
        self._handler = handler

    async def write(self, request: ha_pb2.Report) -> None:
        if self._in.failure is not None:
            raise self._in.failure
        # Serialized and parsed, as on the wire: no object is shared.
        self._out.send(ha_pb2.Report.FromString(request.SerializeToString()))
        await asyncio.sleep(0)

    def read(self) -> Awaitable[Any]:
        return self._in.receive()

    async def code(self) -> grpc.StatusCode:
        return self._server.status[0]

    async def details(self) -> str:
        return self._server.status[1]

    def cancel(self) -> bool:
        if self._handler.done():
            return False
        if self._in.severed:
            return True  # the connection is gone: the server never hears it
        self._server.was_cancelled = True
        self._handler.cancel()
        return True



class MemoryNetwork:
    """Replication streams between addresses, on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, *,
                 delay: Callable[[Any], float] | None = None) -> None:
        self._loop = loop
        self.delay: Callable[[Any], float] = delay or (lambda _msg: 0.0)
        self._servers: dict[str, tuple[Handler, str]] = {}
        self._cut: set[frozenset[str]] = set()
        self._streams: list[tuple[str, str, _Pipe, _Pipe, asyncio.Task[None]]] = []
        self._servicers: dict[str, tuple[Any, str]] = {}
        # Unary calls under way, per serving address (their server tasks).
        self._serving: dict[str, dict[asyncio.Task[Any], None]] = {}
        # Deliveries held by a partition: (src, dst, callback), in order.
        self._held: list[tuple[str, str, Callable[[], None]]] = []
        # Link addresses (link()): each leads to the address it names.
        self._links: dict[str, str] = {}
        # The streams opened through each link address.
        self._through: dict[str, list[tuple[str, str, _Pipe, _Pipe, asyncio.Task[None]]]] = {}

    def serve(self, address: str, handler: Handler, *, token: str) -> None:
        """`handler` (HAMaster.serve) runs each stream opened to `address`."""
        self._servers[address] = (handler, token)

    def unserve(self, address: str) -> None:
        self._servers.pop(address, None)
        self.reset(address)

    def serve_calls(self, address: str, servicer: Any, *, token: str) -> None:
        """Unary calls to `address` run `servicer`'s methods (module doc)."""
        self._servicers[address] = (servicer, token)

    def unserve_calls(self, address: str) -> None:
        """The server at `address` is gone: its calls under way fail
        UNAVAILABLE, new ones too."""
        self._servicers.pop(address, None)
        for task in list(self._serving.pop(address, {})):
            task.cancel()

    def link(self, address: str, target: str) -> None:
        """Make `address` a link to `target`, as a link proxy listening
        there is: what opens a stream to it or calls it reaches `target`
        (partitions are between the two ends, not the link). Pointing an
        existing link elsewhere resets every stream opened through it, as
        restarting the proxy with a new target does: its client reconnects
        and reaches the new target."""
        old = self._links.get(address)
        self._links[address] = target
        if old is not None and old != target:
            for record in list(self._through.get(address, ())):
                self._reset_stream(record)

    def resolve(self, address: str) -> str:
        """The address a stream or call to `address` reaches."""
        return self._links.get(address, address)

    def stub(self, client: str, address: str) -> MemoryStub:
        """A stub the node (or client) at `client` calls `address` with."""
        return MemoryStub(self, client, address)

    def connector(self, address: str) -> MemoryConnector:
        """The connector a node at `address` opens its streams with."""
        return MemoryConnector(self, address)

    # ------------------------------------------------------------ faults
    def partitioned(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self._cut

    def partition(self, a: str, b: str) -> None:
        """Hold every message between a and b (both ways) until heal()."""
        self._cut.add(frozenset((a, b)))

    def heal(self, a: str, b: str) -> None:
        self._cut.discard(frozenset((a, b)))
        for _c, _s, up, down, _t in self._streams:
            up.pump()
            down.pump()
        held, self._held = self._held, []
        for src, dst, deliver in held:
            self._deliver(src, dst, deliver)

    def _deliver(self, src: str, dst: str, deliver: Callable[[], None]) -> None:
        """Run `deliver` once a message from src reached dst: after the
        network's delay, later still if the two are partitioned then."""

        def arrive() -> None:
            if self.partitioned(src, dst):
                self._held.append((src, dst, deliver))
            else:
                deliver()

        self._loop.call_later(max(0.0, self.delay(None)), arrive, context=_WIRE)

    async def _call(self, client: str, address: str, method: str, request: Any, *,
                    timeout: float | None, metadata: Any) -> Any:
        address = self.resolve(address)
        wire = type(request).FromString(request.SerializeToString())
        answer: asyncio.Future[Any] = self._loop.create_future()
        token = dict(metadata or ()).get(TOKEN_METADATA_KEY)

        def settle(result: Any = None, error: BaseException | None = None) -> None:
            if answer.done():
                return
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(result)

        def reply(result: Any = None, error: BaseException | None = None) -> None:
            self._deliver(address, client, lambda: settle(result, error))

        def arrive() -> None:
            entry = self._servicers.get(address)
            if entry is None:
                reply(error=rpc_error(grpc.StatusCode.UNAVAILABLE,
                                       f"failed to connect to {address}: nothing serves it"))
                return
            servicer, expected = entry
            if token != expected:
                reply(error=rpc_error(grpc.StatusCode.UNAUTHENTICATED,
                                       "missing or wrong cluster token"))
                return
            if answer.done():  # past its deadline: the server drops it
                return
            self._run_servicer(address, servicer, method, wire, client, reply)

        self._deliver(client, address, arrive)
        try:
            async with asyncio.timeout(timeout):
                return await answer
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None

    def _run_servicer(self, address: str, servicer: Any, method: str, request: Any,
                      client: str, reply: Callable[..., None]) -> None:
        async def serve() -> None:
            try:
                response = await getattr(servicer, method)(request, UnaryContext(
                    f"memory:{client}"))
            except Aborted as exc:
                reply(error=rpc_error(exc.code, exc.details))
            except asyncio.CancelledError:
                reply(error=rpc_error(grpc.StatusCode.UNAVAILABLE,
                                       f"{address} went away during the call"))
                raise
            except Exception as exc:  # an unexpected servicer error, as gRPC reports it
                reply(error=rpc_error(grpc.StatusCode.UNKNOWN, f"Unexpected {exc!r}"))
            else:
                reply(type(response).FromString(response.SerializeToString()))

        task = self._run_call(address, serve())
        tasks = self._serving.setdefault(address, {})
        tasks[task] = None
        task.add_done_callback(lambda t: tasks.pop(t, None))

    def _run_call(self, address: str, coro: Any) -> asyncio.Task[Any]:
        """Start one call's server side (a simulation runs it as the
        serving node's, as it does a served stream)."""
        return self._loop.create_task(coro)

    def reset(self, address: str) -> None:
        """End every stream to or from `address` as a connection reset does."""
        for record in list(self._streams):
            if address in record[:2]:
                self._reset_stream(record)

    @staticmethod
    def _reset_stream(record: tuple[str, str, _Pipe, _Pipe, asyncio.Task[None]]) -> None:
        _client, _server, up, down, task = record
        down.fail(grpc.aio.AioRpcError(
            grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
            details="connection reset"))
        up.fail(asyncio.CancelledError())
        task.cancel()

    def half_open(self, client: str) -> None:
        """End `client`'s streams on its side only, as a connection the
        client saw reset while the server's end still looks open does: the
        server hears nothing more until its own timeout."""
        for c, _server, _up, down, _task in list(self._streams):
            if c == client:
                down.severed = True
                down.fail(grpc.aio.AioRpcError(
                    grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(),
                    details="Internal error from Core"))

    # ------------------------------------------------------------ streams
    def _open(self, client: str, to: str, token: str) -> _MemoryCall:
        address = self.resolve(to)
        up = _Pipe(self._loop, self, client, address)
        down = _Pipe(self._loop, self, address, client)
        server = _MemoryServerStream(up, down, peer=f"memory:{client}")
        entry = self._servers.get(address)
        handler = entry[0] if entry is not None else None

        async def run() -> None:
            try:
                if entry is None:
                    server.status = (grpc.StatusCode.UNAVAILABLE, f"nothing serves {address}")
                elif token != entry[1]:
                    server.status = (grpc.StatusCode.UNAUTHENTICATED, "bad cluster token")
                else:
                    assert handler is not None
                    await handler(server)
            except grpc.aio.AbortError:
                pass  # server.status says how
            except asyncio.CancelledError:
                server.status = (grpc.StatusCode.CANCELLED, "stream cancelled")
                raise
            finally:
                server.over = True
                if down.failure is None:
                    down.close()

        task = self._loop.create_task(run())
        record = (client, address, up, down, task)
        self._streams.append(record)
        through = self._through.setdefault(to, []) if to != address else None
        if through is not None:
            through.append(record)

        def done(_t: asyncio.Task[None]) -> None:
            self._streams.remove(record)
            if through is not None:
                through.remove(record)

        task.add_done_callback(done)
        return _MemoryCall(up, down, server, task)


class MemoryConnector:
    """An HAConnector over a MemoryNetwork, for the node at `address`."""

    def __init__(self, net: MemoryNetwork, address: str) -> None:
        self._net = net
        self.address = address

    @contextlib.asynccontextmanager
    async def open(self, address: str, token: str) -> AsyncIterator[SlaveCall]:
        call = self._net._open(self.address, address, token)
        try:
            yield call
        finally:
            call.cancel()
