"""The unary-call half of the in-memory transport twin (ha/transport/): what the
in-memory twin (MemoryNetwork.serve_calls / stub) is made of: the stub a
caller awaits, the context a servicer method is given, and gRPC's errors."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, NoReturn

import grpc


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


class UnaryContext:
    """What a servicer method uses of its grpc.aio ServicerContext."""

    def __init__(self, peer: str) -> None:
        self._peer = peer

    async def abort(self, code: grpc.StatusCode, details: str = "") -> NoReturn:
        raise Aborted(code, details)

    def peer(self) -> str:
        return self._peer


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class MemoryStub:
    """A caller's stub to the servicer at `address` (MemoryNetwork.stub)."""

    def __init__(self, net: Any, client: str, address: str) -> None:  # a MemoryNetwork
        self._net = net
        self._client = client
        self._address = address

    def __getattr__(self, method: str) -> Callable[..., Awaitable[Any]]:
        if method.startswith("_"):
            raise AttributeError(method)

        async def call(request: Any, *, timeout: float | None = None,
                       metadata: Any = ()) -> Any:
            return await self._net._call(self._client, self._address, method, request,
                                         timeout=timeout, metadata=metadata)

        return call
