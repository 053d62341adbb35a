from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("broker_id", "epoch", "max_offset", "confirmed_offset", "priority", "address")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    epoch: int
    max_offset: int
    confirmed_offset: int
    priority: int
    address: str
    def __init__(self, broker_id: _Optional[int] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirmed_offset: _Optional[int] = ..., priority: _Optional[int] = ..., address: _Optional[str] = ...) -> None: ...

class ElectMasterRequest(_message.Message):
    __slots__ = ("requester", "preferred")
    REQUESTER_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    requester: int
    preferred: int
    def __init__(self, requester: _Optional[int] = ..., preferred: _Optional[int] = ...) -> None: ...

class GetReplicaInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AlterSyncStateSetRequest(_message.Message):
    __slots__ = ("master", "master_epoch", "sync_state_set_epoch", "new_sync_state_set")
    MASTER_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    master: int
    master_epoch: int
    sync_state_set_epoch: int
    new_sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, master: _Optional[int] = ..., master_epoch: _Optional[int] = ..., sync_state_set_epoch: _Optional[int] = ..., new_sync_state_set: _Optional[_Iterable[int]] = ...) -> None: ...

class GetMetadataRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("master_id", "master_name", "master_address", "master_epoch", "sync_state_set", "sync_state_set_epoch")
    MASTER_ID_FIELD_NUMBER: _ClassVar[int]
    MASTER_NAME_FIELD_NUMBER: _ClassVar[int]
    MASTER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MASTER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_FIELD_NUMBER: _ClassVar[int]
    SYNC_STATE_SET_EPOCH_FIELD_NUMBER: _ClassVar[int]
    master_id: int
    master_name: str
    master_address: str
    master_epoch: int
    sync_state_set: _containers.RepeatedScalarFieldContainer[int]
    sync_state_set_epoch: int
    def __init__(self, master_id: _Optional[int] = ..., master_name: _Optional[str] = ..., master_address: _Optional[str] = ..., master_epoch: _Optional[int] = ..., sync_state_set: _Optional[_Iterable[int]] = ..., sync_state_set_epoch: _Optional[int] = ...) -> None: ...

class ControllerReply(_message.Message):
    __slots__ = ("replica_info", "outcome", "refusal", "reason", "unclean", "broker_id", "rejoined")
    REPLICA_INFO_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    UNCLEAN_FIELD_NUMBER: _ClassVar[int]
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    REJOINED_FIELD_NUMBER: _ClassVar[int]
    replica_info: ReplicaInfo
    outcome: str
    refusal: str
    reason: str
    unclean: bool
    broker_id: int
    rejoined: bool
    def __init__(self, replica_info: _Optional[_Union[ReplicaInfo, _Mapping]] = ..., outcome: _Optional[str] = ..., refusal: _Optional[str] = ..., reason: _Optional[str] = ..., unclean: _Optional[bool] = ..., broker_id: _Optional[int] = ..., rejoined: _Optional[bool] = ...) -> None: ...

class MemberInfo(_message.Message):
    __slots__ = ("broker_id", "name", "address", "heard", "alive", "last_heartbeat_age_ms", "epoch", "max_offset", "confirmed_offset", "priority")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEARD_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    LAST_HEARTBEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    name: str
    address: str
    heard: bool
    alive: bool
    last_heartbeat_age_ms: int
    epoch: int
    max_offset: int
    confirmed_offset: int
    priority: int
    def __init__(self, broker_id: _Optional[int] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., heard: _Optional[bool] = ..., alive: _Optional[bool] = ..., last_heartbeat_age_ms: _Optional[int] = ..., epoch: _Optional[int] = ..., max_offset: _Optional[int] = ..., confirmed_offset: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class Metadata(_message.Message):
    __slots__ = ("replica_info", "members", "heartbeat_timeout_ms", "scan_interval_ms", "elect_unclean_master", "state_file", "pid", "uptime_ms")
    REPLICA_INFO_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SCAN_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    ELECT_UNCLEAN_MASTER_FIELD_NUMBER: _ClassVar[int]
    STATE_FILE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    UPTIME_MS_FIELD_NUMBER: _ClassVar[int]
    replica_info: ReplicaInfo
    members: _containers.RepeatedCompositeFieldContainer[MemberInfo]
    heartbeat_timeout_ms: int
    scan_interval_ms: int
    elect_unclean_master: bool
    state_file: str
    pid: int
    uptime_ms: int
    def __init__(self, replica_info: _Optional[_Union[ReplicaInfo, _Mapping]] = ..., members: _Optional[_Iterable[_Union[MemberInfo, _Mapping]]] = ..., heartbeat_timeout_ms: _Optional[int] = ..., scan_interval_ms: _Optional[int] = ..., elect_unclean_master: _Optional[bool] = ..., state_file: _Optional[str] = ..., pid: _Optional[int] = ..., uptime_ms: _Optional[int] = ...) -> None: ...
