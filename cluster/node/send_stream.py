"""The node's side of the broker's SendStream (proto/broker.proto): many sends
over one long-lived call, modelled on RocketMQ's remoting protocol, where one
connection carries many requests, each tagged with an `opaque` id, and
responses are matched by it and may come back out of order.

Why: a unary RPC costs grpc.aio several times what one message on an open
stream costs, and on two cores that cost, not the store, capped SYNC_MASTER
throughput (see `dlab bench sync-master`).

One SendSession serves one call:
- a reader task reads requests in order and hands each to the node's put path
  (Node.submit) as soon as it is read, so no put waits behind an earlier
  one; puts read in one loop tick share one append and one flush/replica
  wait (the node's batching);
- the call's own coroutine writes each result, tagged with its request's
  opaque id, as soon as its put completes (out of order).
- a stream message may carry several requests (`more`), as a client sends
  the requests it has ready at once; they are taken in order, exactly as
  if each had come alone. Results ready at once go out the same way, in one
  message: grpc.aio's cost is per message written, and on two cores that
  cost, paid once per put at each end, was what capped SYNC_MASTER.

Ordering rules:
- a result is written only after the node's put path answered the request
  (for PUT_OK: after the flush and replica waits the mode promises);
- at most `max_in_flight` requests are taken ahead of their written results
  (plus the rest of the message that reached it); at the cap the reader
  stops reading and HTTP/2 flow control pushes back on the client (bounded
  memory per stream);
- the call ends only once every request taken has its result written: when
  the client half-closes (OK), on a request that cannot be answered
  (undecodable bytes, an opaque id already in flight: INVALID_ARGUMENT), or
  when the node shuts down (UNAVAILABLE; it stops reading first);
- if the client cancels, the call is gone at once: the puts it made still
  complete in the node (Node.submit owns them), their results go nowhere,
  and the client reports them indeterminate.
A request without a message is answered MESSAGE_ILLEGAL under its own id and
the stream carries on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.message import DecodeError

from cluster.node.wire import message_from_pb, result_to_pb
from proto import broker_pb2
from store.log.record import Message
from store.status import PutResult, PutStatus

log = logging.getLogger("dlab.node")

# Requests one stream may have taken ahead of their written results.
MAX_IN_FLIGHT = 512
# Results written in one stream message at most.
MAX_RESULTS_PER_WRITE = 256

Submit = Callable[[Sequence[Message], Callable[[list[PutResult]], object]], None]
End = tuple[grpc.StatusCode, str]


class SendSession:
    def __init__(self, submit: Submit, born_host: tuple[str, int], *, peer: str,
                 max_in_flight: int = MAX_IN_FLIGHT) -> None:
        assert max_in_flight >= 1
        self._submit = submit
        self._born = born_host
        self._peer = peer
        self._max = max_in_flight
        self._taken: set[int] = set()  # opaque ids read whose results are not written yet
        self._ready: deque[broker_pb2.SendStreamResult] = deque()
        self._wake = asyncio.Event()  # results ready, or the reader stopped
        self._room = asyncio.Event()  # the reader may read again
        self._reading = True
        self._end: End | None = None
        self._reader: asyncio.Task[None] | None = None

    async def serve(self, context: grpc.aio.ServicerContext) -> End | None:
        """Run the call until it may end; returns the status to end it with
        (None: end it OK)."""
        # Accept the call at once: the client writes nothing before it sees
        # these (empty) initial metadata, since a write racing a refusal
        # fails client-side as INTERNAL and hides the node's status.
        await context.send_initial_metadata(())
        self._reader = asyncio.get_running_loop().create_task(self._read(context))
        try:
            while True:
                while self._ready:
                    ready = self._ready
                    result = ready.popleft()
                    written = [result.opaque]
                    if ready:
                        n = min(len(ready), MAX_RESULTS_PER_WRITE - 1)
                        more = [ready.popleft() for _ in range(n)]
                        result.more.extend(more)
                        written += [r.opaque for r in more]
                    await context.write(result)
                    self._taken.difference_update(written)
                    if len(self._taken) < self._max:
                        self._room.set()
                if not self._reading and not self._taken:
                    return self._end
                self._wake.clear()
                await self._wake.wait()
        finally:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    def close(self, why: str) -> None:
        """Stop reading (node shutdown): the call ends once the results of
        the requests already taken are written."""
        if self._end is None:
            self._end = (grpc.StatusCode.UNAVAILABLE, why)
        if self._reading and self._reader is not None:
            self._reader.cancel()

    async def _read(self, context: grpc.aio.ServicerContext) -> None:
        try:
            while self._end is None:
                if len(self._taken) >= self._max:
                    self._room.clear()
                    await self._room.wait()
                    continue
                try:
                    request = await context.read()
                except DecodeError as exc:
                    self._refuse(f"a SendStream request could not be decoded ({exc}); send "
                                 "SendStreamRequest messages (proto/broker.proto)")
                    return
                if request is grpc.aio.EOF:
                    return
                self._take(request)
                if request.more:
                    self._take_more(request.more)
        except asyncio.CancelledError:
            pass  # closed by the node, or the call ended
        except Exception as exc:  # the call broke under the read: nothing left to read
            log.info("SendStream from %s: reading stopped: %r", self._peer, exc)
        finally:
            self._reading = False
            self._wake.set()

    def _take(self, request: broker_pb2.SendStreamRequest) -> None:
        opaque = request.opaque
        if opaque in self._taken:
            self._refuse(f"SendStream request id (opaque) {opaque} is already in flight on "
                         "this stream; give every request in flight its own id")
            return
        self._taken.add(opaque)
        if not request.HasField("message"):
            self._answer(opaque, [PutResult(
                PutStatus.MESSAGE_ILLEGAL,
                detail=f"SendStream request {opaque} has no message; set its `message`")])
            return
        self._submit([message_from_pb(request.message, self._born)],
                     lambda results: self._answer(opaque, results))

    def _take_more(self, requests: Sequence[broker_pb2.SendStreamRequest]) -> None:
        """The further requests of one stream message, each taken as if it
        had come alone (its own put, answered when its own promise is kept:
        a put refused SLAVE_NOT_AVAILABLE does not wait for one that waits
        for the slave)."""
        for request in requests:
            if self._end is not None:
                return
            if request.more:
                self._refuse(f"SendStream request {request.opaque} nests `more` requests; "
                             "put every request of a message in the outer request's `more`")
                return
            self._take(request)

    def _answer(self, opaque: int, results: list[PutResult]) -> None:
        (result,) = results
        self._ready.append(broker_pb2.SendStreamResult(opaque=opaque,
                                                       result=result_to_pb(result)))
        self._wake.set()

    def _refuse(self, why: str) -> None:
        log.warning("SendStream from %s: %s", self._peer, why)
        self._end = (grpc.StatusCode.INVALID_ARGUMENT, why)
