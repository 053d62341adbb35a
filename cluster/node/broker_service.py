"""The Broker gRPC service of a node: convert, call the node, map errors to
status codes (the node itself, and its lifecycle, is cluster/node/server.py).
The same servicer answers the simulated network's unary calls
(ha/transport/ MemoryNetwork.serve_calls)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from cluster.node import consume_service
from cluster.node.role import Role
from cluster.node.send_stream import End
from cluster.node.wire import message_from_pb, peer_host, result_to_pb
from proto import broker_pb2, broker_pb2_grpc
from store.log.record import Message
from store.status import PutResult
from store.store import MessageStore

_R = TypeVar("_R")


class BrokerNode(Protocol):
    """What the servicer calls on its node (server.py's Node)."""

    role: Role
    store: MessageStore | None

    async def put_many(self, messages: Sequence[Message]) -> list[PutResult]: ...

    async def serve_send_stream(self, context: grpc.aio.ServicerContext) -> End | None: ...

    def read(self, offset: int, max_bytes: int) -> broker_pb2.ReadResponse: ...

    def status(self) -> broker_pb2.NodeStatus: ...


class BrokerServicer(broker_pb2_grpc.BrokerServicer):
    """Convert, call the node, map errors to status codes."""

    def __init__(self, node: BrokerNode) -> None:
        self.node = node

    async def Send(self, request: broker_pb2.SendRequest, context: grpc.aio.ServicerContext
                   ) -> broker_pb2.SendResult:
        msg = message_from_pb(request.message, peer_host(context.peer()))
        (result,) = await self.node.put_many([msg])
        return result_to_pb(result)

    async def SendStream(self, request_iterator: Any, context: grpc.aio.ServicerContext
                         ) -> None:
        # Requests are read with context.read() (the session's reader task).
        end = await self.node.serve_send_stream(context)
        if end is not None:
            await context.abort(*end)

    async def SendBatch(self, request: broker_pb2.SendBatchRequest,
                        context: grpc.aio.ServicerContext) -> broker_pb2.SendBatchResponse:
        born = peer_host(context.peer())
        results = await self.node.put_many([message_from_pb(m, born) for m in request.messages])
        return broker_pb2.SendBatchResponse(results=[result_to_pb(r) for r in results])

    async def Read(self, request: broker_pb2.ReadRequest, context: grpc.aio.ServicerContext
                   ) -> broker_pb2.ReadResponse:
        try:
            return self.node.read(request.offset, request.max_bytes)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.OUT_OF_RANGE, str(exc))
            raise  # abort raises; this line is for type checkers

    async def Status(self, request: broker_pb2.StatusRequest, context: grpc.aio.ServicerContext
                     ) -> broker_pb2.NodeStatus:
        return self.node.status()

    # The consume side: convert, call, map a bad request to INVALID_ARGUMENT.
    async def Pull(self, request: broker_pb2.PullRequest, context: grpc.aio.ServicerContext
                   ) -> broker_pb2.PullResponse:
        return await self._consume(context, lambda s: consume_service.pull(
            s, request, self.node.role.value))

    async def QueueInfo(self, request: broker_pb2.QueueInfoRequest,
                        context: grpc.aio.ServicerContext) -> broker_pb2.QueueInfoResponse:
        return await self._consume(context, lambda s: consume_service.queue_info(s, request))

    async def CommitOffset(self, request: broker_pb2.CommitOffsetRequest,
                           context: grpc.aio.ServicerContext) -> broker_pb2.CommitOffsetResponse:
        def commit(s: MessageStore) -> broker_pb2.CommitOffsetResponse:
            consume_service.commit_offset(s, request)
            return broker_pb2.CommitOffsetResponse()
        return await self._consume(context, commit)

    async def QueryOffset(self, request: broker_pb2.QueryOffsetRequest,
                          context: grpc.aio.ServicerContext) -> broker_pb2.QueryOffsetResponse:
        return await self._consume(context, lambda s: consume_service.query_offset(s, request))

    async def GetConsumerOffsets(self, request: broker_pb2.ConsumerOffsetsRequest,
                                 context: grpc.aio.ServicerContext
                                 ) -> broker_pb2.ConsumerOffsetsResponse:
        return await self._consume(context, lambda s: broker_pb2.ConsumerOffsetsResponse(
            table_json=consume_service.table_json(s)))

    async def _consume(self, context: grpc.aio.ServicerContext,
                       call: Callable[[MessageStore], _R]) -> _R:
        store = self.node.store
        assert store is not None
        try:
            return call(store)
        except consume_service.BadConsumeRequest as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this line is for type checkers
