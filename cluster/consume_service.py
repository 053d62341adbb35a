"""The node's consume side: pulls, queue ranges, the consumer offset table,
and a slave's copy of its master's table (RocketMQ's SlaveSynchronize).

Where offsets live: consumers commit to the node they talk to. A master's
table is the group's truth; a slave copies its master's whole table every
`sync_interval_ms` (default 10 s) and persists it, so a consumer that
commits to a slave while its master is down keeps those offsets only until
the next sync from a master that is back (as in RocketMQ, where a slave's
table is overwritten by the master's). The gaps between a commit, the
broker's persist (5 s) and the slave's sync are where duplicates come from.
"""

from __future__ import annotations

import asyncio
import json
import logging

import grpc

from cluster.auth import TOKEN_METADATA_KEY
from proto import broker_pb2, broker_pb2_grpc
from store.store import MessageStore

log = logging.getLogger("dlab.node.consume")
MAX_PULL = 1024
DEFAULT_PULL = 32


class BadConsumeRequest(ValueError):
    """A malformed consume request; the message says what to send instead."""


def _check_queue(topic: str, queue_id: int) -> None:
    if not topic:
        raise BadConsumeRequest("topic is empty: name the topic to consume")
    if queue_id < 0:
        raise BadConsumeRequest(f"queue_id {queue_id} is negative: queues are numbered from 0")


def pull(store: MessageStore, req: broker_pb2.PullRequest, role: str) -> broker_pb2.PullResponse:
    _check_queue(req.topic, req.queue_id)
    if req.offset < 0:
        raise BadConsumeRequest(f"offset {req.offset} is negative: pull from a queue offset >= 0")
    if not 0 <= req.max_count <= MAX_PULL:
        raise BadConsumeRequest(f"max_count {req.max_count}: ask for 1..{MAX_PULL} (0 = "
                                f"{DEFAULT_PULL})")
    got = store.get_messages(req.topic, req.queue_id, req.offset, req.max_count or DEFAULT_PULL)
    out = broker_pb2.PullResponse(
        status=broker_pb2.PullStatus.Value(got.status.value), next_offset=got.next_offset,
        min_offset=got.min_offset, max_offset=got.max_offset, node_role=role)
    for m in got.messages:
        r = m.record
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


def commit_offset(store: MessageStore, req: broker_pb2.CommitOffsetRequest) -> None:
    _check_queue(req.topic, req.queue_id)
    if not req.group or "@" in req.group:
        raise BadConsumeRequest("group must be a non-empty name without '@'")
    if req.offset < 0:
        raise BadConsumeRequest(f"offset {req.offset} is negative")
    store.consumer_offsets.commit(req.group, req.topic, req.queue_id, req.offset)


def query_offset(store: MessageStore, req: broker_pb2.QueryOffsetRequest
                 ) -> broker_pb2.QueryOffsetResponse:
    _check_queue(req.topic, req.queue_id)
    if not req.group:
        raise BadConsumeRequest("group is empty: name the consumer group")
    found = store.consumer_offsets.query(req.group, req.topic, req.queue_id)
    return broker_pb2.QueryOffsetResponse(found=found is not None, offset=found or 0)


def table_json(store: MessageStore) -> str:
    return json.dumps(store.consumer_offsets.snapshot())


def parse_table(text: str) -> dict[str, dict[int, int]]:
    raw = json.loads(text)
    return {str(k): {int(q): int(o) for q, o in v.items()} for k, v in raw.items()}


async def sync_from_master(store: MessageStore, master: str, token: str,
                           interval_s: float) -> None:
    """A slave's loop: copy the master's offset table, persist it, repeat."""
    async with grpc.aio.insecure_channel(master) as channel:
        stub = broker_pb2_grpc.BrokerStub(channel)
        while True:
            await asyncio.sleep(interval_s)
            try:
                resp = await stub.GetConsumerOffsets(
                    broker_pb2.ConsumerOffsetsRequest(),
                    metadata=((TOKEN_METADATA_KEY, token),), timeout=5)
                table = parse_table(resp.table_json)
            except (grpc.aio.AioRpcError, ValueError) as exc:
                log.info("consumer offset sync from %s failed: %s", master, exc)
                continue
            if table != store.consumer_offsets.snapshot():
                store.consumer_offsets.replace_all(table)
                await asyncio.get_running_loop().run_in_executor(
                    None, store.consumer_offsets.persist)

