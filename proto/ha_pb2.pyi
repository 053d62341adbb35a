from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Report(_message.Message):
    __slots__ = ("max_offset", "slave", "incarnation")
    MAX_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SLAVE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    max_offset: int
    slave: str
    incarnation: str
    def __init__(self, max_offset: _Optional[int] = ..., slave: _Optional[str] = ..., incarnation: _Optional[str] = ...) -> None: ...

class Range(_message.Message):
    __slots__ = ("offset", "data", "master_wrote")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    MASTER_WROTE_FIELD_NUMBER: _ClassVar[int]
    offset: int
    data: bytes
    master_wrote: int
    def __init__(self, offset: _Optional[int] = ..., data: _Optional[bytes] = ..., master_wrote: _Optional[int] = ...) -> None: ...

class Truncate(_message.Message):
    __slots__ = ("offset", "reason")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    offset: int
    reason: str
    def __init__(self, offset: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class MasterMessage(_message.Message):
    __slots__ = ("range", "truncate")
    RANGE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_FIELD_NUMBER: _ClassVar[int]
    range: Range
    truncate: Truncate
    def __init__(self, range: _Optional[_Union[Range, _Mapping]] = ..., truncate: _Optional[_Union[Truncate, _Mapping]] = ...) -> None: ...
