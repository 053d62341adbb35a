"""The far end of the benchmarks' baselines: a bare grpc.aio server in its
own process with two raw-bytes methods (no protobuf, no store):

- /dlab.bench.Peer/Source (unary -> stream): streams the files a JSON request
  names ({"paths", "total", "chunk"}), `chunk` bytes a message, to the caller —
  the direction of the HA stream (server to client);
- /dlab.bench.Peer/Sink  (stream -> unary): counts the bytes streamed to it
  (client to server, for comparison);
- /dlab.bench.Peer/Echo  (unary -> unary): answers with what it got;
- /dlab.bench.Peer/EchoStream (stream -> stream): answers each message with
  itself, in order — the transport shape of the broker's SendStream.

    python -m ha.bench_peer --port-file FILE   # writes the bound port, serves
                                                # until SIGTERM
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ha.slave import HA_CHANNEL_OPTIONS

SOURCE = "/dlab.bench.Peer/Source"
SINK = "/dlab.bench.Peer/Sink"
ECHO = "/dlab.bench.Peer/Echo"
ECHO_STREAM = "/dlab.bench.Peer/EchoStream"
# The channel options the nodes' HA stream uses.
OPTIONS = HA_CHANNEL_OPTIONS


async def _sink(request_iterator: AsyncIterator[bytes], context: Any) -> bytes:
    total = 0
    async for chunk in request_iterator:
        total += len(chunk)
    return total.to_bytes(8, "big")


async def _source(request: bytes, context: Any) -> AsyncIterator[bytes]:
    spec = json.loads(request)
    left, chunk = int(spec["total"]), int(spec["chunk"])
    for path in spec["paths"]:
        with open(path, "rb", buffering=0) as f:
            while left > 0:
                data = f.read(min(chunk, left))
                if not data:
                    break
                left -= len(data)
                yield data


async def _echo(request: bytes, context: Any) -> bytes:
    return request


async def _echo_stream(request_iterator: AsyncIterator[bytes], context: Any
                       ) -> AsyncIterator[bytes]:
    async for message in request_iterator:
        yield message


class _Handler(grpc.GenericRpcHandler):
    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method == SOURCE:
            return grpc.unary_stream_rpc_method_handler(_source)
        if details.method == SINK:
            return grpc.stream_unary_rpc_method_handler(_sink)
        if details.method == ECHO:
            return grpc.unary_unary_rpc_method_handler(_echo)
        if details.method == ECHO_STREAM:
            return grpc.stream_stream_rpc_method_handler(_echo_stream)
        return None


async def serve(port_file: str) -> int:
    server = grpc.aio.server(options=[*OPTIONS, ("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([_Handler()])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    tmp = port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await server.stop(0)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ha.bench_peer")
    parser.add_argument("--port-file", required=True)
    args = parser.parse_args(argv)
    return asyncio.run(serve(args.port_file))


if __name__ == "__main__":
    sys.exit(main())
