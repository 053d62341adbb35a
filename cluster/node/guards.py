"""Malformed requests to the broker's unary RPCs become INVALID_ARGUMENT with
a message saying what was expected, instead of grpc's UNKNOWN plus a
traceback in the node log. (The HA stream checks its own reports: see
ha/master.py.)"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError

log = logging.getLogger("dlab.node")


class _Malformed:
    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


class MalformedRequestInterceptor(grpc.aio.ServerInterceptor):
    """`definitions`: where the service's messages are defined and who
    sends them, for the refusal's message."""

    def __init__(self, definitions: str = "proto/broker.proto "
                 "(cluster/client/node_client.py does)") -> None:
        self.definitions = definitions

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if (handler is None or handler.request_streaming or handler.response_streaming
                or handler.request_deserializer is None or handler.unary_unary is None):
            return handler
        return _guarded(handler, details.method or "", self.definitions)


def _guarded(handler: grpc.RpcMethodHandler, method: str, definitions: str
             ) -> grpc.RpcMethodHandler:
    deserialize = handler.request_deserializer
    inner = handler.unary_unary
    assert deserialize is not None and inner is not None

    def safe_deserialize(raw: bytes) -> Any:
        try:
            return deserialize(raw)
        except DecodeError as exc:
            return _Malformed(str(exc))

    async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Malformed):
            log.warning("malformed request to %s from %s: %s", method, context.peer(),
                        request.error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"malformed request to {method}: {request.error}; send the "
                                f"messages defined in {definitions}")
        return await inner(request, context)

    return grpc.unary_unary_rpc_method_handler(
        behavior, request_deserializer=safe_deserialize,
        response_serializer=handler.response_serializer)
