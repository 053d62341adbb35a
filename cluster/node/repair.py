"""The REPAIR corruption policy's source of bytes: a damaged CommitLog range
fetched from a replica over the Broker service's Read RPC, with the cluster
token. A master repairs from its slaves (`dlab node --repair-from`), a slave
from its master. The store verifies what comes back (CRC, PHYSICALOFFSET,
whole records ending where valid data resumes) before it writes a byte
(store.log.corruption_policy._repair); this module only fetches.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import grpc

from ha.credentials import token_metadata
from proto import broker_pb2, broker_pb2_grpc
from store.store import RepairSource, RepairUnavailableError

# One Read returns at most this much (the node's MAX_READ_BYTES).
READ_BYTES = 16 * 1024 * 1024
MAX_RANGE_BYTES = 1 << 30
# How long a repairing node waits for some replica to answer at all. The
# nodes of a cluster start together (compose starts every container at
# once), so a master may recover before its slave listens; a replica that
# answers, with bytes or without, ends the wait at once (docs/design.md).
REPLICA_WAIT_S = 20.0
# Not answering: nobody listens yet, or the connect timed out.
_UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def grpc_repair_source(addresses: Sequence[str], token: str, *, timeout_s: float = 10.0,
                       wait_s: float = REPLICA_WAIT_S,
                       clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> RepairSource:
    """A RepairSource asking each replica in turn; the first that returns
    bytes from the range's start wins (the store rejects them if they do not
    verify). While no replica answers, it asks again until `wait_s` after
    its first fetch."""
    peers = tuple(addresses)
    metadata = token_metadata(token)
    started: list[float] = []  # the first fetch's time: one wait for all ranges

    def fetch(offset: int, end: int) -> bytes:
        if end - offset > MAX_RANGE_BYTES:
            raise RepairUnavailableError(f"range [{offset}, {end}) is over {MAX_RANGE_BYTES} "
                                         "bytes")
        if not peers:
            raise RepairUnavailableError("no replica address is known (give --repair-from)")
        if not started:
            started.append(clock())
        while True:
            data, problems, answered = _ask_each(peers, metadata, offset, end, timeout_s)
            if data:
                return data
            waited = clock() - started[0]
            if answered or waited >= wait_s:
                break
            sleep(0.2)
        why = "; ".join(problems)
        if not answered:
            why += (f"; no replica answered within {wait_s:g} s: start a replica that holds "
                    "the range (`dlab cluster start SLAVE`), then start this node again")
        raise RepairUnavailableError(f"no replica holds [{offset}, {end}): {why}")

    return fetch


def _ask_each(peers: Sequence[str], metadata: Sequence[tuple[str, str]], offset: int, end: int,
              timeout_s: float) -> tuple[bytes, list[str], bool]:
    """The first replica's bytes from `offset`, else b""; what each said;
    whether any answered at all."""
    problems: list[str] = []
    answered = False
    for address in peers:
        try:
            data = _fetch_from(address, metadata, offset, end, timeout_s)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            details = exc.details() if hasattr(exc, "details") else str(exc)
            answered = answered or code not in _UNREACHABLE
            problems.append(f"{address}: {code.name if code else 'ERROR'} {details}")
            continue
        answered = True
        if data:
            return data, problems, True
        problems.append(f"{address}: holds nothing at offset {offset}")
    return b"", problems, answered


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
