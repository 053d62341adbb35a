"""The node's consume side: pulls, queue ranges, the consumer offset table,
and a slave's copy of its master's table (RocketMQ's SlaveSynchronize).

Pulls are served by masters and slaves alike (RocketMQ's slave read), each
up to its own confirmed offset. Where a pull finds nothing, a master moves
the consumer's offset back into its queue's range (the store's next offset,
RocketMQ's nextOffsetCorrection); a slave never does (RocketMQ's default
offsetCheckInSlave = false): a slave behind its master must not send a
consumer back over messages it consumed from the master.

Where offsets live (decision): consumers commit to the node they talk to —
the master, or a slave while the master is down (as RocketMQ clients do).
A master's table is the group's truth. A slave takes commits into its own
table (persisted like any table) but copies its master's every
`sync_interval_ms` (default 10 s): each topic@group the master has replaces
the slave's entry (SlaveSynchronize's putAll), so what consumers committed
to the slave survives only for groups the master does not know. The gaps
between a commit, the broker's persist (5 s) and the slave's sync are where
duplicates come from.

The sync is bounded (decision): the master ships only entries whose topic
and group pass store/names.py, and at most OFFSET_SYNC_MAX_BYTES of them
(well inside gRPC's default 4 MiB message), leaving the rest out with a
WARNING; the slave takes each well-formed entry and skips (with a WARNING)
a malformed one. So no entry, however big or odd, stops the other groups'
sync.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from ha.credentials import TOKEN_METADATA_KEY
from ha.transport.grpc_transport import grpc_stub
from proto import broker_pb2
from store.names import group_problem, queue_id_problem, topic_problem
from store.status import GetMessageStatus
from store.store import MessageStore

log = logging.getLogger("dlab.node.consume")
MAX_PULL = 1024
DEFAULT_PULL = 32
# A pull's bodies stop at about this many bytes (at least one message goes),
# well inside gRPC's 64 MiB message limit: 1024 messages of 4 MiB would not
# fit (RocketMQ caps a pull by bytes too, maxTransferBytesOnMessageInMemory).
MAX_PULL_BYTES = 8 * 1024 * 1024
SLAVE_ROLE = "SLAVE"
# The JSON a master sends a syncing slave stops near this size: under
# gRPC's default 4 MiB receive limit of the slave's channel, with room for
# the message's framing (see the module doc).
OFFSET_SYNC_MAX_BYTES = 3 * 1024 * 1024
# The statuses whose next offset is nextOffsetCorrection's (a master's move).
_CORRECTIONS = frozenset({GetMessageStatus.NO_MESSAGE_IN_QUEUE,
                          GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
                          GetMessageStatus.OFFSET_TOO_SMALL,
                          GetMessageStatus.OFFSET_OVERFLOW_BADLY})


class BadConsumeRequest(ValueError):
    """A malformed consume request; the message says what to send instead."""


def _check_queue(topic: str, queue_id: int) -> None:
    # The rules every put obeys (store/names.py): nothing else names a queue.
    problem = topic_problem(topic) or queue_id_problem(queue_id)
    if problem:
        raise BadConsumeRequest(problem)


def pull(store: MessageStore, req: broker_pb2.PullRequest, role: str) -> broker_pb2.PullResponse:
    _check_queue(req.topic, req.queue_id)
    if req.offset < 0:
        raise BadConsumeRequest(f"offset {req.offset} is negative: pull from a queue offset >= 0")
    if not 0 <= req.max_count <= MAX_PULL:
        raise BadConsumeRequest(f"max_count {req.max_count}: ask for 1..{MAX_PULL} (0 = "
                                f"{DEFAULT_PULL})")
    got = store.get_messages(req.topic, req.queue_id, req.offset, req.max_count or DEFAULT_PULL)
    next_offset = got.next_offset
    if role == SLAVE_ROLE and got.status in _CORRECTIONS:
        next_offset = req.offset  # a slave does not correct offsets (see the module doc)
    out = broker_pb2.PullResponse(
        status=broker_pb2.PullStatus.Value(got.status.value), next_offset=next_offset,
        min_offset=got.min_offset, max_offset=got.max_offset, node_role=role)
    total = 0
    for m in got.messages:
        r = m.record
        total += r.size
        if total > MAX_PULL_BYTES and out.messages:
            out.next_offset = m.queue_offset  # the rest in the next pull
            break
        out.messages.add(queue_offset=m.queue_offset, commitlog_offset=m.commitlog_offset,
                         size=r.size, msg_id=r.msg_id or "", body=r.body,
                         properties=r.properties, store_timestamp_ms=r.store_timestamp_ms,
                         born_timestamp_ms=r.born_timestamp_ms)
    return out


def queue_info(store: MessageStore, req: broker_pb2.QueueInfoRequest
               ) -> broker_pb2.QueueInfoResponse:
    out = broker_pb2.QueueInfoResponse(confirmed_offset=store.confirmed_offset())
    for topic, qids in store.topic_queues().items():
        if req.topic and topic != req.topic:
            continue
        for qid in qids:
            low, high = store.queue_offsets(topic, qid)
            out.queues.add(topic=topic, queue_id=qid, min_offset=low, max_offset=high)
    return out


def _check_group(group: str) -> None:
    # RocketMQ's rule (store/names.py): the table's keys stay short and printable.
    if problem := group_problem(group):
        raise BadConsumeRequest(problem)


def commit_offset(store: MessageStore, req: broker_pb2.CommitOffsetRequest) -> None:
    _check_queue(req.topic, req.queue_id)
    _check_group(req.group)
    if req.offset < 0:
        raise BadConsumeRequest(f"offset {req.offset} is negative")
    store.consumer_offsets.commit(req.group, req.topic, req.queue_id, req.offset)


def query_offset(store: MessageStore, req: broker_pb2.QueryOffsetRequest
                 ) -> broker_pb2.QueryOffsetResponse:
    _check_queue(req.topic, req.queue_id)
    _check_group(req.group)
    found = store.consumer_offsets.query(req.group, req.topic, req.queue_id)
    return broker_pb2.QueryOffsetResponse(found=found is not None, offset=found or 0)


def key_problem(key: object) -> str | None:
    """What is wrong with `key` as an offset table key (`topic@group`)."""
    if not isinstance(key, str) or "@" not in key:
        return f"key {str(key)[:80]!r} is not topic@group"
    topic, _, group = key.partition("@")
    return topic_problem(topic) or group_problem(group)


def sync_table(table: dict[str, dict[int, int]], max_bytes: int = OFFSET_SYNC_MAX_BYTES
               ) -> tuple[str, list[str]]:
    """The JSON a master sends a syncing slave, and what it left out (each
    a sentence): entries with a bad key, and those past `max_bytes`."""
    parts: list[str] = []
    left_out: list[str] = []
    size = 2  # the braces
    for key in sorted(table):
        if problem := key_problem(key):
            left_out.append(problem)
            continue
        part = json.dumps(key) + ": " + json.dumps(
            {str(q): o for q, o in sorted(table[key].items())})
        if size + len(part) + 2 > max_bytes:
            left_out.append(f"{key} and what sorts after it: the table is over "
                            f"{max_bytes} bytes")
            break
        parts.append(part)
        size += len(part) + 2
    return "{" + ", ".join(parts) + "}", left_out


def status_offsets(table: dict[str, dict[int, int]]) -> tuple[dict[str, dict[int, int]], int]:
    """The table as a node's status shows it: the well-formed entries, and
    how many others it leaves out (a table persisted before groups were
    checked may hold megabyte names; a status must still fit a reply)."""
    shown = {k: v for k, v in table.items() if key_problem(k) is None}
    return shown, len(table) - len(shown)


def table_json(store: MessageStore) -> str:
    text, left_out = sync_table(store.consumer_offsets.snapshot())
    if left_out:
        log.warning("consumer offset sync leaves out %d entr%s: %s", len(left_out),
                    "y" if len(left_out) == 1 else "ies", "; ".join(left_out[:5]))
    return text


def parse_table(text: str) -> tuple[dict[str, dict[int, int]], list[str]]:
    """A master's table as a slave takes it: the well-formed entries, and a
    sentence for each one skipped. Raises ValueError only when the text is
    not a JSON object at all."""
    raw = json.loads(text)
    if not isinstance(raw, dict):
        raise ValueError("the offset table is not a JSON object")
    table: dict[str, dict[int, int]] = {}
    skipped: list[str] = []
    for key, queues in raw.items():
        problem = key_problem(key)
        if problem is None:
            try:
                table[key] = {int(q): int(o) for q, o in queues.items()}
                continue
            except (AttributeError, TypeError, ValueError):
                problem = f"{key}: queues are not {{queue id: offset}}"
        skipped.append(problem)
    return table, skipped


def merge_from_master(mine: dict[str, dict[int, int]], masters: dict[str, dict[int, int]]
                      ) -> dict[str, dict[int, int]]:
    """The slave's table after a sync: each topic@group of the master's
    replaces the slave's (putAll); groups only the slave has stay."""
    return {**mine, **{k: dict(v) for k, v in masters.items()}}


@dataclass
class OffsetSyncState:
    """What a slave's sync loop did last (shown in the node's status)."""

    syncs: int = 0  # tables received from the master
    changes: int = 0  # syncs that changed the slave's table (and persisted it)
    last_sync_ms: int = 0
    last_error: str = ""


async def sync_from_master(store: MessageStore, master: str, token: str,
                           interval_s: float, state: OffsetSyncState, *,
                           stub: Any | None = None,
                           wall_ms: Callable[[], int] | None = None) -> None:
    """A slave's loop: every `interval_s`, copy the master's offset table
    over its own and persist it when that changed anything. The call goes
    over a grpc.aio channel to `master`, or through `stub` (a broker stub
    of the transport seam, ha/transport/: the in-memory network's in a
    simulation)."""
    if stub is None:
        async with grpc_stub(master) as real:
            await _sync_loop(store, real, master, token, interval_s, state, wall_ms)
    else:
        await _sync_loop(store, stub, master, token, interval_s, state, wall_ms)


async def _sync_loop(store: MessageStore, stub: Any, master: str, token: str,
                     interval_s: float, state: OffsetSyncState,
                     wall_ms: Callable[[], int] | None) -> None:
    now_ms = wall_ms or (lambda: time.time_ns() // 1_000_000)
    while True:
        await asyncio.sleep(interval_s)
        try:
            resp = await stub.GetConsumerOffsets(
                broker_pb2.ConsumerOffsetsRequest(),
                metadata=((TOKEN_METADATA_KEY, token),), timeout=5)
            table, skipped = parse_table(resp.table_json)
        except (grpc.aio.AioRpcError, ValueError) as exc:
            detail = (f"{exc.code().name}: {exc.details()}"
                      if isinstance(exc, grpc.aio.AioRpcError) else str(exc))[:300]
            if detail != state.last_error:  # every group's sync stopped: a WARNING
                log.warning("consumer offset sync from %s failed: %s", master, detail)
            state.last_error = detail
            continue
        state.syncs += 1
        state.last_sync_ms = now_ms()
        note = f"skipped {len(skipped)} bad entr{'y' if len(skipped) == 1 else 'ies'}"
        if skipped and note != state.last_error:  # the other groups were synced
            log.warning("consumer offset sync from %s %s: %s", master, note,
                        "; ".join(skipped[:5]))
        state.last_error = note if skipped else ""
        mine = store.consumer_offsets.snapshot()
        merged = merge_from_master(mine, table)
        if merged != mine:
            store.consumer_offsets.replace_all(merged)
            state.changes += 1
            try:
                await store.run_io(store.consumer_offsets.persist)
            except OSError as exc:  # the table stays dirty: the store's persist retries
                state.last_error = f"persist failed: {exc}"
                log.warning("persisting the synced offset table failed: %s", exc)
