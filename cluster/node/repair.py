"""The REPAIR corruption policy's source of bytes: a damaged CommitLog range
fetched from a replica over the Broker service's Read RPC, with the cluster
token. A master repairs from its slaves (`dlab node --repair-from`), a slave
from its master. The store verifies what comes back (CRC, PHYSICALOFFSET,
whole records ending where valid data resumes) before it writes a byte
(store.log.corruption_policy._repair); this module only fetches.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.store import RepairSource, RepairUnavailableError

# One Read returns at most this much (the node's MAX_READ_BYTES).
READ_BYTES = 16 * 1024 * 1024
MAX_RANGE_BYTES = 1 << 30


def grpc_repair_source(addresses: Sequence[str], token: str, *, timeout_s: float = 10.0
                       ) -> RepairSource:
    """A RepairSource asking each replica in turn; the first that returns
    bytes from the range's start wins (the store rejects them if they do not
    verify)."""
    peers = tuple(addresses)
    metadata = token_metadata(token)

    def fetch(offset: int, end: int) -> bytes:
        if end - offset > MAX_RANGE_BYTES:
            raise RepairUnavailableError(f"range [{offset}, {end}) is over {MAX_RANGE_BYTES} "
                                         "bytes")
        problems: list[str] = []
        for address in peers:
            try:
                data = _fetch_from(address, metadata, offset, end, timeout_s)
            except grpc.RpcError as exc:
                code = exc.code().name if hasattr(exc, "code") else "ERROR"
                details = exc.details() if hasattr(exc, "details") else str(exc)
                problems.append(f"{address}: {code} {details}")
                continue
            if data:
                return data
            problems.append(f"{address}: holds nothing at offset {offset}")
        if not peers:
            raise RepairUnavailableError("no replica address is known (give --repair-from)")
        raise RepairUnavailableError(f"no replica holds [{offset}, {end}): "
                                     + "; ".join(problems))

    return fetch


def _fetch_from(address: str, metadata: Sequence[tuple[str, str]], offset: int, end: int,
                timeout_s: float) -> bytes:
    parts: list[bytes] = []
    pos = offset
    with grpc.insecure_channel(address, options=[
            ("grpc.max_receive_message_length", READ_BYTES + (1 << 20))]) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while pos < end:
            resp = stub.Read(broker_pb2.ReadRequest(offset=pos, max_bytes=min(READ_BYTES,
                                                                               end - pos)),
                             timeout=timeout_s, metadata=metadata)
            if not resp.data or resp.next_offset <= pos:
                break
            parts.append(resp.data)
            # After a blank, next_offset is the next segment's start: the
            # range (never across a segment) is done.
            if resp.next_offset != pos + len(resp.data):
                break
            pos = resp.next_offset
    return b"".join(parts)
