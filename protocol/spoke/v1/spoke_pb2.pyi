from protocol.hub.v1 import hub_pb2 as _hub_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EnsureBlocksRequest(_message.Message):
    __slots__ = ("blocks",)
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    blocks: _containers.RepeatedCompositeFieldContainer[_hub_pb2.BlockRef]
    def __init__(self, blocks: _Optional[_Iterable[_Union[_hub_pb2.BlockRef, _Mapping]]] = ...) -> None: ...

class EnsureBlocksResponse(_message.Message):
    __slots__ = ("was_cached",)
    WAS_CACHED_FIELD_NUMBER: _ClassVar[int]
    was_cached: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, was_cached: _Optional[_Iterable[bool]] = ...) -> None: ...

class RecordAccessRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digests: _Optional[_Iterable[str]] = ...) -> None: ...

class RecordAccessResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
