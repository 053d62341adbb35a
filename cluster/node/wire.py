"""Conversions between the broker protos and the store's types, shared by
the node (server side) and the client."""

from __future__ import annotations

from proto import broker_pb2
from store.log.record import Message
from store.status import Evidence, PutResult, PutStatus, Quorum, SlaveAck

# What a Message takes on the wire beside its body: topic (up to 127 bytes),
# properties (RocketMQ caps them at 32 KiB) and protobuf framing, with
# room to spare.
ENVELOPE_BYTES = 1 << 20
# gRPC's limits on one message are int32s: the largest body any node can
# take over gRPC (a --max-message-size above it is refused at start).
GRPC_MESSAGE_LIMIT_BYTES = 2**31 - 1
MAX_BODY_BYTES = GRPC_MESSAGE_LIMIT_BYTES - ENVELOPE_BYTES


def grpc_limit_for(body_bytes: int) -> int:
    """The gRPC max send/receive length that lets a message of `body_bytes`
    through: the node's max message size, not gRPC, must be the limit a put
    meets first."""
    return min(body_bytes + ENVELOPE_BYTES, GRPC_MESSAGE_LIMIT_BYTES)


_STATUS_TO_PB = {s: broker_pb2.PutStatus.Value(s.value) for s in PutStatus}
_PB_TO_STATUS = {v: k for k, v in _STATUS_TO_PB.items()}


def message_to_pb(msg: Message) -> broker_pb2.Message:
    return broker_pb2.Message(
        topic=msg.topic, body=msg.body, properties=dict(msg.properties),
        queue_id=msg.queue_id, flag=msg.flag, born_timestamp_ms=msg.born_timestamp_ms,
    )


def message_from_pb(pb: broker_pb2.Message, born_host: tuple[str, int]) -> Message:
    return Message(
        topic=pb.topic, body=pb.body, properties=dict(pb.properties), queue_id=pb.queue_id,
        flag=pb.flag, born_timestamp_ms=pb.born_timestamp_ms, born_host=born_host,
    )


def result_to_pb(r: PutResult) -> broker_pb2.SendResult:
    pb = broker_pb2.SendResult(
        status=_STATUS_TO_PB[r.status], offset=r.offset, size=r.size, msg_id=r.msg_id or "",
        store_timestamp_ms=r.store_timestamp_ms, detail=r.detail,
    )
    ev = r.evidence
    if ev is not None:
        pb.evidence.wrote, pb.evidence.flushed, pb.evidence.by = ev.wrote, ev.flushed, ev.by
        for a in ev.acks:
            pb.evidence.acks.add(slave=a.slave, acked=a.acked, shipped=a.shipped)
        if ev.quorum is not None:
            q = pb.evidence.quorum
            q.needed = ev.quorum.needed
            q.any_slave = ev.quorum.members is None
            q.members.extend(ev.quorum.members or ())
    return pb


def evidence_from_pb(pb: broker_pb2.SendResult) -> Evidence | None:
    """The evidence a SendResult carries (None: none, as from an older node)."""
    if not pb.HasField("evidence"):
        return None
    ev = pb.evidence
    quorum = None
    if ev.HasField("quorum"):
        q = ev.quorum
        quorum = Quorum(q.needed, None if q.any_slave else tuple(q.members))
    return Evidence(ev.wrote, ev.flushed,
                    tuple(SlaveAck(a.slave, a.acked, a.shipped) for a in ev.acks), ev.by,
                    quorum)


def status_from_pb(value: int) -> PutStatus:
    """The PutStatus of a wire value; an unknown value (a newer node) is UNKNOWN_ERROR."""
    return _PB_TO_STATUS.get(value, PutStatus.UNKNOWN_ERROR)


def peer_host(peer: str) -> tuple[str, int]:
    """grpc's peer string ('ipv4:127.0.0.1:5555', 'ipv6:[::1]:5555') as (host, port);
    anything else as ('127.0.0.1', 0)."""
    kind, _, rest = peer.partition(":")
    host, _, port = rest.rpartition(":")
    if kind == "ipv4" and host:
        try:
            return host, int(port)
        except ValueError:
            pass
    return "127.0.0.1", 0
