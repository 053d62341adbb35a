from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PutStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUT_STATUS_UNSPECIFIED: _ClassVar[PutStatus]
    PUT_OK: _ClassVar[PutStatus]
    FLUSH_DISK_TIMEOUT: _ClassVar[PutStatus]
    FLUSH_SLAVE_TIMEOUT: _ClassVar[PutStatus]
    SLAVE_NOT_AVAILABLE: _ClassVar[PutStatus]
    MESSAGE_ILLEGAL: _ClassVar[PutStatus]
    SERVICE_NOT_AVAILABLE: _ClassVar[PutStatus]
    UNKNOWN_ERROR: _ClassVar[PutStatus]
    IN_SYNC_REPLICAS_NOT_ENOUGH: _ClassVar[PutStatus]

class PullStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PULL_STATUS_UNSPECIFIED: _ClassVar[PullStatus]
    FOUND: _ClassVar[PullStatus]
    NO_MESSAGE_IN_QUEUE: _ClassVar[PullStatus]
    NO_MATCHED_LOGIC_QUEUE: _ClassVar[PullStatus]
    OFFSET_TOO_SMALL: _ClassVar[PullStatus]
    OFFSET_OVERFLOW_ONE: _ClassVar[PullStatus]
    OFFSET_OVERFLOW_BADLY: _ClassVar[PullStatus]
    OFFSET_FOUND_NULL: _ClassVar[PullStatus]
PUT_STATUS_UNSPECIFIED: PutStatus
PUT_OK: PutStatus
FLUSH_DISK_TIMEOUT: PutStatus
FLUSH_SLAVE_TIMEOUT: PutStatus
SLAVE_NOT_AVAILABLE: PutStatus
MESSAGE_ILLEGAL: PutStatus
SERVICE_NOT_AVAILABLE: PutStatus
UNKNOWN_ERROR: PutStatus
IN_SYNC_REPLICAS_NOT_ENOUGH: PutStatus
PULL_STATUS_UNSPECIFIED: PullStatus
FOUND: PullStatus
NO_MESSAGE_IN_QUEUE: PullStatus
NO_MATCHED_LOGIC_QUEUE: PullStatus
OFFSET_TOO_SMALL: PullStatus
OFFSET_OVERFLOW_ONE: PullStatus
OFFSET_OVERFLOW_BADLY: PullStatus
OFFSET_FOUND_NULL: PullStatus

class Message(_message.Message):
    __slots__ = ("topic", "body", "properties", "queue_id", "flag", "born_timestamp_ms")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    FLAG_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    queue_id: int
    flag: int
    born_timestamp_ms: int
    def __init__(self, topic: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., queue_id: _Optional[int] = ..., flag: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ...) -> None: ...

class SendRequest(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: Message
    def __init__(self, message: _Optional[_Union[Message, _Mapping]] = ...) -> None: ...

class SendResult(_message.Message):
    __slots__ = ("status", "offset", "size", "msg_id", "store_timestamp_ms", "detail", "evidence")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    status: PutStatus
    offset: int
    size: int
    msg_id: str
    store_timestamp_ms: int
    detail: str
    evidence: PutEvidence
    def __init__(self, status: _Optional[_Union[PutStatus, str]] = ..., offset: _Optional[int] = ..., size: _Optional[int] = ..., msg_id: _Optional[str] = ..., store_timestamp_ms: _Optional[int] = ..., detail: _Optional[str] = ..., evidence: _Optional[_Union[PutEvidence, _Mapping]] = ...) -> None: ...

class PutEvidence(_message.Message):
    __slots__ = ("wrote", "flushed", "acks", "by", "quorum")
    WROTE_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    ACKS_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    QUORUM_FIELD_NUMBER: _ClassVar[int]
    wrote: int
    flushed: int
    acks: _containers.RepeatedCompositeFieldContainer[SlaveAckPosition]
    by: str
    quorum: AckQuorum
    def __init__(self, wrote: _Optional[int] = ..., flushed: _Optional[int] = ..., acks: _Optional[_Iterable[_Union[SlaveAckPosition, _Mapping]]] = ..., by: _Optional[str] = ..., quorum: _Optional[_Union[AckQuorum, _Mapping]] = ...) -> None: ...

class AckQuorum(_message.Message):
    __slots__ = ("needed", "members", "any_slave")
    NEEDED_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    ANY_SLAVE_FIELD_NUMBER: _ClassVar[int]
    needed: int
    members: _containers.RepeatedScalarFieldContainer[str]
    any_slave: bool
    def __init__(self, needed: _Optional[int] = ..., members: _Optional[_Iterable[str]] = ..., any_slave: _Optional[bool] = ...) -> None: ...

class SlaveAckPosition(_message.Message):
    __slots__ = ("slave", "acked", "shipped")
    SLAVE_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    SHIPPED_FIELD_NUMBER: _ClassVar[int]
    slave: str
    acked: int
    shipped: int
    def __init__(self, slave: _Optional[str] = ..., acked: _Optional[int] = ..., shipped: _Optional[int] = ...) -> None: ...

class SendStreamRequest(_message.Message):
    __slots__ = ("opaque", "message", "more")
    OPAQUE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    opaque: int
    message: Message
    more: _containers.RepeatedCompositeFieldContainer[SendStreamRequest]
    def __init__(self, opaque: _Optional[int] = ..., message: _Optional[_Union[Message, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SendStreamRequest, _Mapping]]] = ...) -> None: ...

class SendStreamResult(_message.Message):
    __slots__ = ("opaque", "result", "more")
    OPAQUE_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    opaque: int
    result: SendResult
    more: _containers.RepeatedCompositeFieldContainer[SendStreamResult]
    def __init__(self, opaque: _Optional[int] = ..., result: _Optional[_Union[SendResult, _Mapping]] = ..., more: _Optional[_Iterable[_Union[SendStreamResult, _Mapping]]] = ...) -> None: ...

class SendBatchRequest(_message.Message):
    __slots__ = ("messages",)
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[Message]
    def __init__(self, messages: _Optional[_Iterable[_Union[Message, _Mapping]]] = ...) -> None: ...

class SendBatchResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[SendResult]
    def __init__(self, results: _Optional[_Iterable[_Union[SendResult, _Mapping]]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("offset", "max_bytes")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    offset: int
    max_bytes: int
    def __init__(self, offset: _Optional[int] = ..., max_bytes: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("data", "next_offset", "min_offset", "wrote")
    DATA_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    next_offset: int
    min_offset: int
    wrote: int
    def __init__(self, data: _Optional[bytes] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., wrote: _Optional[int] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SlaveLink(_message.Message):
    __slots__ = ("slave", "peer", "state", "acked", "shipped", "connected_since_ms", "last_report_ms", "detail", "sessions")
    SLAVE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ACKED_FIELD_NUMBER: _ClassVar[int]
    SHIPPED_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_SINCE_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_MS_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    slave: str
    peer: str
    state: str
    acked: int
    shipped: int
    connected_since_ms: int
    last_report_ms: int
    detail: str
    sessions: int
    def __init__(self, slave: _Optional[str] = ..., peer: _Optional[str] = ..., state: _Optional[str] = ..., acked: _Optional[int] = ..., shipped: _Optional[int] = ..., connected_since_ms: _Optional[int] = ..., last_report_ms: _Optional[int] = ..., detail: _Optional[str] = ..., sessions: _Optional[int] = ...) -> None: ...

class MasterLink(_message.Message):
    __slots__ = ("address", "state", "reported", "connects", "last_error", "last_contact_ms", "truncations")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_FIELD_NUMBER: _ClassVar[int]
    CONNECTS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    LAST_CONTACT_MS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATIONS_FIELD_NUMBER: _ClassVar[int]
    address: str
    state: str
    reported: int
    connects: int
    last_error: str
    last_contact_ms: int
    truncations: int
    def __init__(self, address: _Optional[str] = ..., state: _Optional[str] = ..., reported: _Optional[int] = ..., connects: _Optional[int] = ..., last_error: _Optional[str] = ..., last_contact_ms: _Optional[int] = ..., truncations: _Optional[int] = ...) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("name", "role", "flush_mode", "crash_model", "min_offset", "flushed", "wrote", "slave_ahead_policy", "ha_ship_limit", "slaves", "master", "recovery_json", "failpoint_hits", "pid", "failed", "config_json", "confirmed_offset", "consume_json", "epochs", "ha_mode", "sync_state_set", "master_epoch")
    class FailpointHitsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    FLUSH_MODE_FIELD_NUMBER: _ClassVar[int]
    CRASH_MODEL_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    FLUSHED_FIELD_NUMBER: _ClassVar[int]
    WROTE_FIELD_NUMBER: _ClassVar[int]
    SLAVE_AHEAD_POLICY_FIELD_NUMBER: _ClassVar[int]
    HA_SHIP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    SLAVES_FIELD_NUMBER: _ClassVar[int]
    MASTER_FIELD_NUMBER: _ClassVar[int]
    RECOVERY_JSON_FIELD_NUMBER: _ClassVar[int]
    FAILPOINT_HITS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    FAILED_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONSUME_JSON_FIELD_NUMBER: _ClassVar[int]
    EPOCHS_FIELD_NUMBER: _ClassVar[int]
    HA_MODE_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    flush_mode: str
    crash_model: str
    min_offset: int
    flushed: int
    wrote: int
    slave_ahead_policy: str
    ha_ship_limit: str
    slaves: _containers.RepeatedCompositeFieldContainer[SlaveLink]
    master: MasterLink
    recovery_json: str
    failpoint_hits: _containers.ScalarMap[str, int]
    pid: int
    failed: str
    config_json: str
    confirmed_offset: int
    consume_json: str
    epochs: _containers.RepeatedCompositeFieldContainer[EpochEntry]
    ha_mode: str
    sync_state_set: _containers.RepeatedScalarFieldContainer[str]
    master_epoch: int
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., flush_mode: _Optional[str] = ..., crash_model: _Optional[str] = ..., min_offset: _Optional[int] = ..., flushed: _Optional[int] = ..., wrote: _Optional[int] = ..., slave_ahead_policy: _Optional[str] = ..., ha_ship_limit: _Optional[str] = ..., slaves: _Optional[_Iterable[_Union[SlaveLink, _Mapping]]] = ..., master: _Optional[_Union[MasterLink, _Mapping]] = ..., recovery_json: _Optional[str] = ..., failpoint_hits: _Optional[_Mapping[str, int]] = ..., pid: _Optional[int] = ..., failed: _Optional[str] = ..., config_json: _Optional[str] = ..., confirmed_offset: _Optional[int] = ..., consume_json: _Optional[str] = ..., epochs: _Optional[_Iterable[_Union[EpochEntry, _Mapping]]] = ..., ha_mode: _Optional[str] = ..., sync_state_set: _Optional[_Iterable[str]] = ..., master_epoch: _Optional[int] = ...) -> None: ...

class EpochEntry(_message.Message):
    __slots__ = ("epoch", "start_offset")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    start_offset: int
    def __init__(self, epoch: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("topic", "queue_id", "offset", "max_count")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_COUNT_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    offset: int
    max_count: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ..., max_count: _Optional[int] = ...) -> None: ...

class PulledMessage(_message.Message):
    __slots__ = ("queue_offset", "commitlog_offset", "size", "msg_id", "body", "properties", "store_timestamp_ms", "born_timestamp_ms")
    class PropertiesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    QUEUE_OFFSET_FIELD_NUMBER: _ClassVar[int]
    COMMITLOG_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MSG_ID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    PROPERTIES_FIELD_NUMBER: _ClassVar[int]
    STORE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    BORN_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    queue_offset: int
    commitlog_offset: int
    size: int
    msg_id: str
    body: bytes
    properties: _containers.ScalarMap[str, str]
    store_timestamp_ms: int
    born_timestamp_ms: int
    def __init__(self, queue_offset: _Optional[int] = ..., commitlog_offset: _Optional[int] = ..., size: _Optional[int] = ..., msg_id: _Optional[str] = ..., body: _Optional[bytes] = ..., properties: _Optional[_Mapping[str, str]] = ..., store_timestamp_ms: _Optional[int] = ..., born_timestamp_ms: _Optional[int] = ...) -> None: ...

class PullResponse(_message.Message):
    __slots__ = ("status", "messages", "next_offset", "min_offset", "max_offset", "node_role")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    NEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    NODE_ROLE_FIELD_NUMBER: _ClassVar[int]
    status: PullStatus
    messages: _containers.RepeatedCompositeFieldContainer[PulledMessage]
    next_offset: int
    min_offset: int
    max_offset: int
    node_role: str
    def __init__(self, status: _Optional[_Union[PullStatus, str]] = ..., messages: _Optional[_Iterable[_Union[PulledMessage, _Mapping]]] = ..., next_offset: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ..., node_role: _Optional[str] = ...) -> None: ...

class QueueInfoRequest(_message.Message):
    __slots__ = ("topic",)
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    topic: str
    def __init__(self, topic: _Optional[str] = ...) -> None: ...

class QueueRange(_message.Message):
    __slots__ = ("topic", "queue_id", "min_offset", "max_offset")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    MIN_OFFSET_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int
    def __init__(self, topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., min_offset: _Optional[int] = ..., max_offset: _Optional[int] = ...) -> None: ...

class QueueInfoResponse(_message.Message):
    __slots__ = ("queues", "confirmed_offset")
    QUEUES_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    queues: _containers.RepeatedCompositeFieldContainer[QueueRange]
    confirmed_offset: int
    def __init__(self, queues: _Optional[_Iterable[_Union[QueueRange, _Mapping]]] = ..., confirmed_offset: _Optional[int] = ...) -> None: ...

class CommitOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id", "offset")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    offset: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ..., offset: _Optional[int] = ...) -> None: ...

class CommitOffsetResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class QueryOffsetRequest(_message.Message):
    __slots__ = ("group", "topic", "queue_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    QUEUE_ID_FIELD_NUMBER: _ClassVar[int]
    group: str
    topic: str
    queue_id: int
    def __init__(self, group: _Optional[str] = ..., topic: _Optional[str] = ..., queue_id: _Optional[int] = ...) -> None: ...

class QueryOffsetResponse(_message.Message):
    __slots__ = ("found", "offset")
    FOUND_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    found: bool
    offset: int
    def __init__(self, found: _Optional[bool] = ..., offset: _Optional[int] = ...) -> None: ...

class ConsumerOffsetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ConsumerOffsetsResponse(_message.Message):
    __slots__ = ("table_json",)
    TABLE_JSON_FIELD_NUMBER: _ClassVar[int]
    table_json: str
    def __init__(self, table_json: _Optional[str] = ...) -> None: ...
