from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EntryType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ENTRY_TYPE_UNSPECIFIED: _ClassVar[EntryType]
    ENTRY_TYPE_FILE: _ClassVar[EntryType]
    ENTRY_TYPE_DIRECTORY: _ClassVar[EntryType]
    ENTRY_TYPE_SYMLINK: _ClassVar[EntryType]
ENTRY_TYPE_UNSPECIFIED: EntryType
ENTRY_TYPE_FILE: EntryType
ENTRY_TYPE_DIRECTORY: EntryType
ENTRY_TYPE_SYMLINK: EntryType

class ListDatasetsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Dataset(_message.Message):
    __slots__ = ("name", "version_count", "latest_version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_COUNT_FIELD_NUMBER: _ClassVar[int]
    LATEST_VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version_count: int
    latest_version: str
    def __init__(self, name: _Optional[str] = ..., version_count: _Optional[int] = ..., latest_version: _Optional[str] = ...) -> None: ...

class ListDatasetsResponse(_message.Message):
    __slots__ = ("datasets",)
    DATASETS_FIELD_NUMBER: _ClassVar[int]
    datasets: _containers.RepeatedCompositeFieldContainer[Dataset]
    def __init__(self, datasets: _Optional[_Iterable[_Union[Dataset, _Mapping]]] = ...) -> None: ...

class ListVersionsRequest(_message.Message):
    __slots__ = ("dataset",)
    DATASET_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    def __init__(self, dataset: _Optional[str] = ...) -> None: ...

class Tag(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class ListVersionsResponse(_message.Message):
    __slots__ = ("versions", "tags")
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    TAGS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[Snapshot]
    tags: _containers.RepeatedCompositeFieldContainer[Tag]
    def __init__(self, versions: _Optional[_Iterable[_Union[Snapshot, _Mapping]]] = ..., tags: _Optional[_Iterable[_Union[Tag, _Mapping]]] = ...) -> None: ...

class ResolveRefRequest(_message.Message):
    __slots__ = ("dataset", "ref")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    ref: str
    def __init__(self, dataset: _Optional[str] = ..., ref: _Optional[str] = ...) -> None: ...

class Snapshot(_message.Message):
    __slots__ = ("dataset", "version", "snapshot_id", "created_ns", "block_size", "file_count", "total_bytes")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_NS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    version: str
    snapshot_id: str
    created_ns: int
    block_size: int
    file_count: int
    total_bytes: int
    def __init__(self, dataset: _Optional[str] = ..., version: _Optional[str] = ..., snapshot_id: _Optional[str] = ..., created_ns: _Optional[int] = ..., block_size: _Optional[int] = ..., file_count: _Optional[int] = ..., total_bytes: _Optional[int] = ...) -> None: ...

class GetManifestRequest(_message.Message):
    __slots__ = ("dataset", "ref")
    DATASET_FIELD_NUMBER: _ClassVar[int]
    REF_FIELD_NUMBER: _ClassVar[int]
    dataset: str
    ref: str
    def __init__(self, dataset: _Optional[str] = ..., ref: _Optional[str] = ...) -> None: ...

class BlockRef(_message.Message):
    __slots__ = ("digest", "size")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    digest: str
    size: int
    def __init__(self, digest: _Optional[str] = ..., size: _Optional[int] = ...) -> None: ...

class ManifestEntry(_message.Message):
    __slots__ = ("path", "type", "mode", "size", "mtime_ns", "symlink_target", "blocks")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    MTIME_NS_FIELD_NUMBER: _ClassVar[int]
    SYMLINK_TARGET_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    path: str
    type: EntryType
    mode: int
    size: int
    mtime_ns: int
    symlink_target: str
    blocks: _containers.RepeatedCompositeFieldContainer[BlockRef]
    def __init__(self, path: _Optional[str] = ..., type: _Optional[_Union[EntryType, str]] = ..., mode: _Optional[int] = ..., size: _Optional[int] = ..., mtime_ns: _Optional[int] = ..., symlink_target: _Optional[str] = ..., blocks: _Optional[_Iterable[_Union[BlockRef, _Mapping]]] = ...) -> None: ...

class ReadBlocksRequest(_message.Message):
    __slots__ = ("digests",)
    DIGESTS_FIELD_NUMBER: _ClassVar[int]
    digests: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, digests: _Optional[_Iterable[str]] = ...) -> None: ...

class BlockChunk(_message.Message):
    __slots__ = ("digest", "offset", "data", "block_size", "last")
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    LAST_FIELD_NUMBER: _ClassVar[int]
    digest: str
    offset: int
    data: bytes
    block_size: int
    last: bool
    def __init__(self, digest: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ..., block_size: _Optional[int] = ..., last: _Optional[bool] = ...) -> None: ...
