"""The Python client of a node: what `dlab send` and the chaos harness use.

Every send returns a SendOutcome carrying status, offset, size and message id.
When the call itself fails (connection refused, node killed mid-call,
deadline exceeded) the outcome is INDETERMINATE: the message may or may not
be stored, and the client never reports it as lost. Status, read and other
calls raise NodeCallError with a readable message instead.

Two flavours with the same methods: AsyncNodeClient (grpc.aio, for load)
and NodeClient (blocking, for scripts and tests). AsyncNodeClient.send
multiplexes concurrent sends over one SendStream call per client object
(opened on the first send, reopened on the next send after it fails; see
_SendStream); NodeClient.send and every send_batch are unary calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.json_format import MessageToDict

from cluster.node.auth import read_token_file
from cluster.node.wire import (
    GRPC_MESSAGE_LIMIT_BYTES,
    evidence_from_pb,
    grpc_limit_for,
    message_to_pb,
    status_from_pb,
)
from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.log.record import BLANK_MAGIC, UNIQ_KEY, Message, Record, decode, peek
from store.status import INDETERMINATE

CHANNEL_OPTIONS = [
    # What a node sends is bounded by the node (a pull by MAX_PULL_BYTES and
    # one message, a read by MAX_READ_BYTES), so take any size gRPC carries:
    # a message up to the node's max message size must reach a consumer.
    ("grpc.max_receive_message_length", GRPC_MESSAGE_LIMIT_BYTES),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def merged_options(extra: Sequence[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """CHANNEL_OPTIONS with `extra` in place of any it names (a channel
    given one key twice does not promise which value holds)."""
    return list({**dict(CHANNEL_OPTIONS), **dict(extra)}.items())


def send_options(body_bytes: int) -> list[tuple[str, Any]]:
    """Channel options for sending bodies of `body_bytes`: the client's own
    gRPC limit never refuses a put the node would take (CHANNEL_OPTIONS'
    64 MiB also carries a write of many small messages, WRITE_MAX_*)."""
    send = max(dict(CHANNEL_OPTIONS)["grpc.max_send_message_length"],
               grpc_limit_for(body_bytes))
    return [("grpc.max_send_message_length", send)]


# How long one connection attempt may take, TCP connect to the server's
# HTTP/2 SETTINGS. gRPC core reads "grpc.min_reconnect_backoff_ms" as this
# minimum connect timeout, not as a backoff (default 20 s, never under
# 100 ms): set to a few ms it failed calls with "connection attempt timed
# out before receiving SETTINGS frame" wherever the handshake is slow — a
# loaded machine, docker-proxy in front of a container (docs/design.md).
MIN_CONNECT_TIMEOUT_MS = 5_000
# For a caller that polls a node while it starts: retry a refused connection
# every few ms instead of grpc's default 1 s (growing) reconnect backoff,
# and give each attempt the connect timeout above.
FAST_RECONNECT = [
    ("grpc.initial_reconnect_backoff_ms", 5),
    ("grpc.min_reconnect_backoff_ms", MIN_CONNECT_TIMEOUT_MS),
    ("grpc.max_reconnect_backoff_ms", 50),
]


class NodeCallError(RuntimeError):
    """A non-send call failed; the message names the node, the gRPC code and
    what to check."""

    def __init__(self, address: str, method: str, code: grpc.StatusCode, details: str) -> None:
        hint = {
            grpc.StatusCode.UNAVAILABLE: "is the node running and reachable at that address?",
            grpc.StatusCode.UNAUTHENTICATED: "use this cluster's token file (DIR/token)",
            grpc.StatusCode.DEADLINE_EXCEEDED: "the node did not answer in time "
                                               "(paused or overloaded?)",
        }.get(code, "")
        super().__init__(f"{method} on {address} failed: {code.name}: {details}"
                         + (f" — {hint}" if hint else ""))
        self.code = code


@dataclass(frozen=True)
class SendOutcome:
    """One send as the client saw it. `status` is a PutStatus name or
    INDETERMINATE; offset and size are None unless the node stored it."""

    status: str
    msg_id: str
    offset: int | None = None
    size: int | None = None
    store_timestamp_ms: int | None = None
    detail: str = ""
    invoke_ms: int = 0
    complete_ms: int = 0
    latency_s: float = 0.0
    # Set by a routed send (cluster/client/routing.py): the address that
    # answered, how many sends it took, and whether the node that stored it
    # was no longer the route's master when its answer came.
    node: str = ""
    attempts: int = 1
    stale_master: bool = False
    # A PUT_OK's evidence: the positions the node answered on
    # (store/status.py Evidence.as_json; None from a node that sent none).
    evidence: dict[str, Any] | None = None

    @property
    def indeterminate(self) -> bool:
        return self.status == INDETERMINATE

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "msg_id": self.msg_id, "offset": self.offset,
                "size": self.size, "detail": self.detail, "invoke_ms": self.invoke_ms,
                "complete_ms": self.complete_ms}


@dataclass(frozen=True)
class ReadChunk:
    records: list[Record]
    next_offset: int
    wrote: int


def new_msg_id() -> str:
    return uuid.uuid4().hex.upper()


def make_message(topic: str, body: bytes, *, msg_id: str | None = None, queue_id: int = 0,
                 born_timestamp_ms: int | None = None) -> Message:
    """A Message with its UNIQ_KEY set (generated when not given)."""
    return Message(topic, body, {UNIQ_KEY: msg_id or new_msg_id()}, queue_id=queue_id,
                   born_timestamp_ms=born_timestamp_ms if born_timestamp_ms is not None
                   else time.time_ns() // 1_000_000)


def _outcome(pb: broker_pb2.SendResult, msg_id: str, t0: float, invoke_ms: int) -> SendOutcome:
    status = status_from_pb(pb.status)
    stored = status.stored
    ev = evidence_from_pb(pb)
    return SendOutcome(
        status=status.value, msg_id=pb.msg_id or msg_id,
        offset=pb.offset if stored else None, size=pb.size if stored else None,
        store_timestamp_ms=pb.store_timestamp_ms if stored else None, detail=pb.detail,
        invoke_ms=invoke_ms, complete_ms=time.time_ns() // 1_000_000,
        latency_s=time.perf_counter() - t0, evidence=None if ev is None else ev.as_json(),
    )


# How a send that got no result ended: (gRPC code name, details).
_Failure = tuple[str, str]


def _failed(failure: _Failure, msg_id: str, t0: float, invoke_ms: int) -> SendOutcome:
    name, details = failure
    return SendOutcome(status=INDETERMINATE, msg_id=msg_id, detail=f"{name}: {details}",
                       invoke_ms=invoke_ms, complete_ms=time.time_ns() // 1_000_000,
                       latency_s=time.perf_counter() - t0)


def _indeterminate(exc: grpc.RpcError, msg_id: str, t0: float, invoke_ms: int) -> SendOutcome:
    code = exc.code() if hasattr(exc, "code") else None
    details = exc.details() if hasattr(exc, "details") else str(exc)
    return _failed((code.name if code is not None else "ERROR", details), msg_id, t0,
                   invoke_ms)


# One SendStream message carries at most this many requests, and more than
# one only while their bodies total at most WRITE_MAX_BODY_BYTES.
WRITE_MAX_REQUESTS = 256
WRITE_MAX_BODY_BYTES = 1024 * 1024


class _SendStream:
    """One SendStream call shared by a client's concurrent sends (RocketMQ's
    remoting model: requests tagged with an `opaque` id, results matched by
    it, in any order).

    A writer task writes queued requests in order (grpc allows one write at
    a time per call), all those queued at once in one stream message (up to
    WRITE_MAX_REQUESTS / WRITE_MAX_BODY_BYTES; the node answers the same
    way): grpc.aio's cost is per message written. A reader task resolves
    each send's future by the result's id. When the call ends for any
    reason, every send still waiting gets the same failure — the outcome a
    failed unary Send gives (INDETERMINATE, the call's code and details) —
    and `failure` tells the client to open a new call for the next send. A
    send whose own timeout passes first is INDETERMINATE (DEADLINE_EXCEEDED);
    a late result for it is dropped."""

    def __init__(self, stub: broker_pb2_grpc.BrokerStub,
                 metadata: tuple[tuple[str, str], ...]) -> None:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self.call = stub.SendStream(metadata=metadata)
        self.pending: dict[int, asyncio.Future[broker_pb2.SendResult | _Failure]] = {}
        self.failure: _Failure | None = None
        self._queue: deque[tuple[int, broker_pb2.Message]] = deque()
        self._wake = asyncio.Event()
        self._next_opaque = 0
        self.writes = 0  # stream messages written (each carries one or more requests)
        self._writer = loop.create_task(self._write())
        self._reader = loop.create_task(self._read())

    def submit(self, message: broker_pb2.Message
               ) -> tuple[int, asyncio.Future[broker_pb2.SendResult | _Failure]]:
        assert self.failure is None, "a failed stream takes no more sends"
        self._next_opaque += 1
        opaque = self._next_opaque
        fut: asyncio.Future[broker_pb2.SendResult | _Failure] = self._loop.create_future()
        self.pending[opaque] = fut
        self._queue.append((opaque, message))
        self._wake.set()
        return opaque, fut

    def expire(self, opaque: int, timeout_s: float) -> None:
        fut = self.pending.pop(opaque, None)
        if fut is not None and not fut.done():
            fut.set_result(("DEADLINE_EXCEEDED",
                            f"no result within {timeout_s:g} s on the send stream"))

    async def close(self) -> None:
        self.call.cancel()
        for task in (self._reader, self._writer):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _write(self) -> None:
        try:
            # Nothing is written before the node has accepted the call (it
            # sends its initial metadata first): a write racing a refusal
            # fails client-side as INTERNAL and hides the node's status
            # (UNAUTHENTICATED for a wrong token), which the reader reports.
            await self.call.initial_metadata()
            if self.call.done():
                return
            queue = self._queue
            while True:
                while queue:
                    opaque, message = queue.popleft()
                    request = broker_pb2.SendStreamRequest(opaque=opaque, message=message)
                    body_bytes = len(message.body)
                    more = request.more
                    while (queue and len(more) < WRITE_MAX_REQUESTS - 1
                           and body_bytes + len(queue[0][1].body) <= WRITE_MAX_BODY_BYTES):
                        opaque, message = queue.popleft()
                        more.add(opaque=opaque, message=message)
                        body_bytes += len(message.body)
                    await self.call.write(request)
                    self.writes += 1
                self._wake.clear()
                await self._wake.wait()
        except asyncio.CancelledError:
            pass
        except Exception:
            # grpc fails a write once the call has ended; the reader reports
            # how it ended. Anything else: end the call so the reader does.
            if not self.call.done():
                self.call.cancel()

    async def _read(self) -> None:
        failure: _Failure = ("CANCELLED", "the client closed its send stream")
        try:
            while True:
                response = await self.call.read()
                if response is grpc.aio.EOF:
                    code = await self.call.code()
                    failure = (code.name, (await self.call.details())
                               or "the node ended the send stream before answering")
                    break
                pending = self.pending
                fut = pending.pop(response.opaque, None)
                if fut is not None and not fut.done():
                    fut.set_result(response.result)
                for r in response.more:
                    fut = pending.pop(r.opaque, None)
                    if fut is not None and not fut.done():
                        fut.set_result(r.result)
        except grpc.aio.AioRpcError as exc:
            failure = (exc.code().name, exc.details() or "")
        except asyncio.CancelledError:
            pass
        finally:
            self.failure = failure
            self._writer.cancel()
            pending, self.pending = self.pending, {}
            for fut in pending.values():
                if not fut.done():
                    fut.set_result(failure)


def decode_chunk(resp: broker_pb2.ReadResponse, offset: int) -> ReadChunk:
    records = []
    data = resp.data
    pos = 0
    while pos + 8 <= len(data):
        size, magic = peek(data, pos)
        if magic == BLANK_MAGIC:
            break
        records.append(decode(data, pos, offset=offset + pos))
        pos += size
    return ReadChunk(records, resp.next_offset, resp.wrote)


class AsyncNodeClient:
    def __init__(self, address: str, *, token: str, timeout_s: float = 10.0,
                 channel_options: Sequence[tuple[str, Any]] = ()) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = token_metadata(token)
        self._channel = grpc.aio.insecure_channel(address,
                                                  options=merged_options(channel_options))
        self._stub = broker_pb2_grpc.BrokerStub(self._channel)
        self._stream: _SendStream | None = None

    async def __aenter__(self) -> AsyncNodeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Ends the send stream (sends still waiting come back
        INDETERMINATE) and the channel."""
        if self._stream is not None:
            await self._stream.close()
        await self._channel.close()

    async def send(self, msg: Message, *, timeout_s: float | None = None) -> SendOutcome:
        """One message over this client's send stream; concurrent sends
        share it. INDETERMINATE when no result came back within the timeout
        or the stream failed before its result."""
        msg_id = msg.msg_id or ""
        invoke_ms, t0 = time.time_ns() // 1_000_000, time.perf_counter()
        stream = self._stream
        if stream is None or stream.failure is not None:
            stream = self._stream = _SendStream(self._stub, self._metadata)
        timeout = timeout_s or self.timeout_s
        opaque, fut = stream.submit(message_to_pb(msg))
        timer = asyncio.get_running_loop().call_later(timeout, stream.expire, opaque, timeout)
        try:
            result = await fut
        finally:
            timer.cancel()
            stream.pending.pop(opaque, None)
        if isinstance(result, tuple):
            return _failed(result, msg_id, t0, invoke_ms)
        return _outcome(result, msg_id, t0, invoke_ms)

    async def send_batch(self, msgs: Sequence[Message], *, timeout_s: float | None = None
                         ) -> list[SendOutcome]:
        invoke_ms, t0 = time.time_ns() // 1_000_000, time.perf_counter()
        req = broker_pb2.SendBatchRequest(messages=[message_to_pb(m) for m in msgs])
        try:
            resp = await self._stub.SendBatch(req, timeout=timeout_s or self.timeout_s,
                                              metadata=self._metadata)
        except grpc.RpcError as exc:
            return [_indeterminate(exc, m.msg_id or "", t0, invoke_ms) for m in msgs]
        return [_outcome(pb, m.msg_id or "", t0, invoke_ms)
                for pb, m in zip(resp.results, msgs, strict=True)]

    async def status(self, *, timeout_s: float | None = None) -> broker_pb2.NodeStatus:
        return await self._call("Status", broker_pb2.StatusRequest(), timeout_s)

    async def max_message_size(self, *, timeout_s: float | None = None) -> int | None:
        """The largest body the node stores (its max_message_size_bytes,
        from the config its status reports); None if it does not say."""
        st = await self.status(timeout_s=timeout_s)
        size = json.loads(st.config_json or "{}").get("store", {}).get("max_message_size_bytes")
        return size if isinstance(size, int) else None

    async def read(self, offset: int, max_bytes: int = 1 << 20, *,
                   timeout_s: float | None = None) -> ReadChunk:
        resp = await self._call("Read", broker_pb2.ReadRequest(offset=offset,
                                                               max_bytes=max_bytes), timeout_s)
        return decode_chunk(resp, offset)

    async def _call(self, method: str, request: Any, timeout_s: float | None) -> Any:
        try:
            return await getattr(self._stub, method)(request, timeout=timeout_s or self.timeout_s,
                                                     metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise NodeCallError(self.address, method, exc.code(), exc.details() or "") from None


class NodeClient:
    """Blocking client with the same methods as AsyncNodeClient.

    `stub`: call the node through this object (BrokerStub's blocking
    methods, failing with grpc.RpcError) instead of a gRPC channel to
    `address`: the backend contract suite hands it one that carries each
    call over a simulated cluster's in-memory network, so the same client
    code runs there."""

    def __init__(self, address: str, *, token: str, timeout_s: float = 10.0,
                 channel_options: Sequence[tuple[str, Any]] = (), stub: Any = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._metadata = token_metadata(token)
        self._channel = None if stub is not None else grpc.insecure_channel(
            address, options=merged_options(channel_options))
        self._stub = stub if stub is not None else broker_pb2_grpc.BrokerStub(self._channel)

    def __enter__(self) -> NodeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()

    def send(self, msg: Message, *, timeout_s: float | None = None) -> SendOutcome:
        msg_id = msg.msg_id or ""
        invoke_ms, t0 = time.time_ns() // 1_000_000, time.perf_counter()
        try:
            pb = self._stub.Send(broker_pb2.SendRequest(message=message_to_pb(msg)),
                                 timeout=timeout_s or self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as exc:
            return _indeterminate(exc, msg_id, t0, invoke_ms)
        return _outcome(pb, msg_id, t0, invoke_ms)

    def send_batch(self, msgs: Sequence[Message], *, timeout_s: float | None = None
                   ) -> list[SendOutcome]:
        invoke_ms, t0 = time.time_ns() // 1_000_000, time.perf_counter()
        req = broker_pb2.SendBatchRequest(messages=[message_to_pb(m) for m in msgs])
        try:
            resp = self._stub.SendBatch(req, timeout=timeout_s or self.timeout_s,
                                        metadata=self._metadata)
        except grpc.RpcError as exc:
            return [_indeterminate(exc, m.msg_id or "", t0, invoke_ms) for m in msgs]
        return [_outcome(pb, m.msg_id or "", t0, invoke_ms)
                for pb, m in zip(resp.results, msgs, strict=True)]

    def status(self, *, timeout_s: float | None = None) -> broker_pb2.NodeStatus:
        return self._call("Status", broker_pb2.StatusRequest(), timeout_s)

    def status_dict(self, *, timeout_s: float | None = None) -> dict[str, Any]:
        """Node status as a plain dict (int64 fields as ints, defaults included)."""
        return status_to_dict(self.status(timeout_s=timeout_s))

    def read(self, offset: int, max_bytes: int = 1 << 20, *,
             timeout_s: float | None = None) -> ReadChunk:
        resp = self._call("Read", broker_pb2.ReadRequest(offset=offset, max_bytes=max_bytes),
                          timeout_s)
        return decode_chunk(resp, offset)

    def read_all(self, start: int = 0, *, limit_bytes: int = 1 << 30) -> list[Record]:
        """Every record from `start` to the node's wrote (bounded by limit_bytes)."""
        out: list[Record] = []
        offset = start
        while offset - start < limit_bytes:
            chunk = self.read(offset)
            out.extend(chunk.records)
            if chunk.next_offset <= offset or chunk.next_offset >= chunk.wrote:
                break
            offset = chunk.next_offset
        return out

    def _call(self, method: str, request: Any, timeout_s: float | None) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=timeout_s or self.timeout_s,
                                               metadata=self._metadata)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise NodeCallError(self.address, method, code, details or "") from None


def status_to_dict(st: broker_pb2.NodeStatus) -> dict[str, Any]:
    d = MessageToDict(st, preserving_proto_field_name=True,
                      always_print_fields_with_no_presence=True)
    _ints(d)
    for key in ("recovery_json", "config_json", "consume_json"):
        raw = d.pop(key, "")
        d[key.removesuffix("_json")] = json.loads(raw) if raw else {}
    if not st.HasField("master"):
        d.pop("master", None)
    return d


def _ints(obj: Any) -> None:
    """MessageToDict renders int64 as strings; turn them back into ints."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, str) and k not in _STRING_FIELDS and _is_int(v):
                obj[k] = int(v)
            else:
                _ints(v)
    elif isinstance(obj, list):
        for v in obj:
            _ints(v)


_STRING_FIELDS = {"name", "slave", "peer", "address", "detail", "last_error", "state", "role"}


def _is_int(v: str) -> bool:
    return v.lstrip("-").isdigit()


@dataclass(frozen=True)
class ClusterTarget:
    """Where a cluster's master is and the token to talk to it."""

    master_address: str
    token: str
    addresses: dict[str, str]


def cluster_target(directory: str) -> ClusterTarget:
    """Read DIR/cluster.json and DIR/token of a cluster started by `dlab cluster up`."""
    path = os.path.join(directory, "cluster.json")
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"no cluster in {directory} (no cluster.json); start one with "
                                f"`dlab cluster up --dir {directory}`") from None
    nodes = state["nodes"]
    master = state["master"]
    return ClusterTarget(nodes[master]["address"],
                         read_token_file(os.path.join(directory, "token")),
                         {n: v["address"] for n, v in nodes.items()})

