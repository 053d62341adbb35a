"""The production transport: the replication stream and broker calls over
grpc.aio (the seam's protocols are in ha/transport/streams.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from ha.credentials import token_metadata
from ha.transport.streams import REPLICATE_METHOD, SlaveCall
from proto import broker_pb2_grpc, ha_pb2

# Ranges up to the batch size plus one maximal record, with room to spare;
# the largest HTTP/2 frames, so a 1 MiB range is not cut into 16 KiB frames
# (see docs/performance-notes.md, "Slave catch-up").
HA_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 128 * 1024 * 1024),
    ("grpc.max_send_message_length", 128 * 1024 * 1024),
    ("grpc.http2.max_frame_size", 16 * 1024 * 1024 - 1),
]


class GrpcConnector:
    """The replication stream over grpc.aio (one channel per stream)."""

    @contextlib.asynccontextmanager
    async def open(self, address: str, token: str) -> AsyncIterator[SlaveCall]:
        async with grpc.aio.insecure_channel(address, options=HA_CHANNEL_OPTIONS) as channel:
            # Raw responses: ranges are decoded by ha/frames.py, which
            # takes their data without copying it out of a message.
            replicate = channel.stream_stream(
                REPLICATE_METHOD, request_serializer=ha_pb2.Report.SerializeToString,
                response_deserializer=None)
            yield replicate(metadata=token_metadata(token))


@contextlib.asynccontextmanager
async def grpc_stub(address: str) -> AsyncIterator[Any]:
    """A broker stub over a grpc.aio channel to `address` (the real twin of
    MemoryNetwork.stub); the channel closes with the context."""
    async with grpc.aio.insecure_channel(address) as channel:
        yield broker_pb2_grpc.BrokerStub(channel)
