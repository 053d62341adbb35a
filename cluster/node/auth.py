"""The cluster's shared token: how it is made, stored, sent and checked.

Decision: every broker RPC (Send, SendBatch, Read, Status) and the HA stream
require the token; only gRPC health checking and server reflection stay open,
so standard tools can probe a node without it. Producers in this lab are the
harness and `dlab send`, which read the token from the cluster directory, so
requiring it everywhere costs nothing and keeps strangers on the host from
writing into a store under test.

The token travels as gRPC metadata (`x-dlab-token`, ha/credentials.py), never
on a command line (nodes read it from a 0600 file). It is compared with
hmac.compare_digest.
A refused call gets UNAUTHENTICATED with a message saying what to fix, and
the node logs the refusal with the peer address.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from ha.credentials import TOKEN_METADATA_KEY

OPEN_SERVICES = ("/grpc.health.v1.Health/", "/grpc.reflection.")
MAX_TOKEN_BYTES = 4096

log = logging.getLogger("dlab.auth")


class TokenError(ValueError):
    """The token file is missing, unreadable or empty; the message says how to fix it."""


def generate_token() -> str:
    return secrets.token_hex(32)


def write_token_file(path: str, token: str) -> None:
    """Write `token` to `path` readable by the owner only (0600)."""
    # O_NOFOLLOW: never truncate and rewrite the file a link points to.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii") + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)


def read_token_file(path: str) -> str:
    try:
        st = os.stat(path)
        with open(path, "rb") as f:
            raw = f.read(MAX_TOKEN_BYTES + 1)
    except FileNotFoundError:
        raise TokenError(f"token file {path} does not exist; pass the cluster's token file "
                         "(DIR/token of `dlab cluster up --dir DIR`)") from None
    except OSError as exc:
        raise TokenError(f"cannot read token file {path}: {exc.strerror}") from None
    if len(raw) > MAX_TOKEN_BYTES:
        raise TokenError(f"token file {path} is larger than {MAX_TOKEN_BYTES} bytes; "
                         "it should hold one line with the token")
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise TokenError(f"token file {path} is not ASCII text; it should hold one line "
                         "with the token") from None
    if not token or any(c.isspace() for c in token):
        raise TokenError(f"token file {path} must hold exactly one non-empty word")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("token file %s is readable by group or others; chmod 600 it", path)
    return token


def token_matches(presented: str | bytes | None, expected: bytes) -> bool:
    if presented is None:
        return False
    if isinstance(presented, str):
        presented = presented.encode("utf-8", "replace")
    return hmac.compare_digest(presented, expected)


class TokenInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every call outside OPEN_SERVICES that lacks the right token."""

    def __init__(self, token: str) -> None:
        self._expected = token.encode("utf-8")

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        method = details.method or ""
        if method.startswith(OPEN_SERVICES):
            return await continuation(details)
        presented = None
        for key, value in details.invocation_metadata or ():
            if key == TOKEN_METADATA_KEY:
                presented = value
                break
        if token_matches(presented, self._expected):
            return await continuation(details)
        handler = await continuation(details)
        why = "missing" if presented is None else "wrong"
        return _refusal(handler, method, why)


def _refusal(handler: grpc.RpcMethodHandler | None, method: str, why: str
             ) -> grpc.RpcMethodHandler:
    message = (f"{why} cluster token for {method}: send the token of this cluster "
               f"(DIR/token) as '{TOKEN_METADATA_KEY}' metadata, e.g. `dlab send --dir DIR` "
               "or --token-file")

    async def refuse(request: Any, context: grpc.aio.ServicerContext) -> Any:
        log.warning("refused %s from %s: %s token", method, context.peer(), why)
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    # Same streaming shape as the real method, so grpc accepts the handler;
    # no deserializer: a refused request is never parsed.
    if handler is None or (not handler.request_streaming and not handler.response_streaming):
        return grpc.unary_unary_rpc_method_handler(refuse)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    return grpc.unary_stream_rpc_method_handler(refuse)
