from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TransactionState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    TRANSACTION_STATE_UNSPECIFIED: _ClassVar[TransactionState]
    OPEN: _ClassVar[TransactionState]
    PREWRITTEN: _ClassVar[TransactionState]
    COMMITTED: _ClassVar[TransactionState]
    APPLIED: _ClassVar[TransactionState]
    ABORTED: _ClassVar[TransactionState]

class WriteMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WRITE_MODE_UNSPECIFIED: _ClassVar[WriteMode]
    APPEND: _ClassVar[WriteMode]
    OVERWRITE: _ClassVar[WriteMode]
    OVERWRITE_PARTITIONS: _ClassVar[WriteMode]
    ROW_LEVEL: _ClassVar[WriteMode]

class Consistency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONSISTENCY_UNSPECIFIED: _ClassVar[Consistency]
    CONSISTENCY_SNAPSHOT: _ClassVar[Consistency]
    CONSISTENCY_TOPOLOGY: _ClassVar[Consistency]
    CONSISTENCY_READ_COMMITTED: _ClassVar[Consistency]

class Permission(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PERMISSION_UNSPECIFIED: _ClassVar[Permission]
    WRITE: _ClassVar[Permission]
    DESCRIBE: _ClassVar[Permission]
    ADMIN: _ClassVar[Permission]
    READ: _ClassVar[Permission]

class ResourceType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESOURCE_TYPE_UNSPECIFIED: _ClassVar[ResourceType]
    PIPELINE: _ClassVar[ResourceType]
    TABLE: _ClassVar[ResourceType]

class EdgeKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EDGE_KIND_UNSPECIFIED: _ClassVar[EdgeKind]
    EDGE_READS: _ClassVar[EdgeKind]
    EDGE_WRITES: _ClassVar[EdgeKind]

class QuarantineChoice(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    QUARANTINE_CHOICE_UNSPECIFIED: _ClassVar[QuarantineChoice]
    QUARANTINE_REAPPLY: _ClassVar[QuarantineChoice]
    QUARANTINE_ABANDON: _ClassVar[QuarantineChoice]
TRANSACTION_STATE_UNSPECIFIED: TransactionState
OPEN: TransactionState
PREWRITTEN: TransactionState
COMMITTED: TransactionState
APPLIED: TransactionState
ABORTED: TransactionState
WRITE_MODE_UNSPECIFIED: WriteMode
APPEND: WriteMode
OVERWRITE: WriteMode
OVERWRITE_PARTITIONS: WriteMode
ROW_LEVEL: WriteMode
CONSISTENCY_UNSPECIFIED: Consistency
CONSISTENCY_SNAPSHOT: Consistency
CONSISTENCY_TOPOLOGY: Consistency
CONSISTENCY_READ_COMMITTED: Consistency
PERMISSION_UNSPECIFIED: Permission
WRITE: Permission
DESCRIBE: Permission
ADMIN: Permission
READ: Permission
RESOURCE_TYPE_UNSPECIFIED: ResourceType
PIPELINE: ResourceType
TABLE: ResourceType
EDGE_KIND_UNSPECIFIED: EdgeKind
EDGE_READS: EdgeKind
EDGE_WRITES: EdgeKind
QUARANTINE_CHOICE_UNSPECIFIED: QuarantineChoice
QUARANTINE_REAPPLY: QuarantineChoice
QUARANTINE_ABANDON: QuarantineChoice

class AddFile(_message.Message):
    __slots__ = ("path", "size", "partition_values", "null_partition_columns", "modification_time", "stats")
    class PartitionValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_PARTITION_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    MODIFICATION_TIME_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    partition_values: _containers.ScalarMap[str, str]
    null_partition_columns: _containers.RepeatedScalarFieldContainer[str]
    modification_time: int
    stats: str
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., partition_values: _Optional[_Mapping[str, str]] = ..., null_partition_columns: _Optional[_Iterable[str]] = ..., modification_time: _Optional[int] = ..., stats: _Optional[str] = ...) -> None: ...

class TableWrite(_message.Message):
    __slots__ = ("table", "mode", "add_files", "schema_json", "partition_by", "replace_partitions", "merge_schema", "catalog_name", "remove_files", "read_version", "operation", "operation_metrics", "rearranges_only", "operation_parameters", "change_files", "read_set", "deletion_vectors")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    ADD_FILES_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    PARTITION_BY_FIELD_NUMBER: _ClassVar[int]
    REPLACE_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    MERGE_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    CATALOG_NAME_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FILES_FIELD_NUMBER: _ClassVar[int]
    READ_VERSION_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    OPERATION_METRICS_FIELD_NUMBER: _ClassVar[int]
    REARRANGES_ONLY_FIELD_NUMBER: _ClassVar[int]
    OPERATION_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    CHANGE_FILES_FIELD_NUMBER: _ClassVar[int]
    READ_SET_FIELD_NUMBER: _ClassVar[int]
    DELETION_VECTORS_FIELD_NUMBER: _ClassVar[int]
    table: str
    mode: WriteMode
    add_files: _containers.RepeatedCompositeFieldContainer[AddFile]
    schema_json: str
    partition_by: _containers.RepeatedScalarFieldContainer[str]
    replace_partitions: _containers.RepeatedCompositeFieldContainer[PartitionSpec]
    merge_schema: bool
    catalog_name: str
    remove_files: _containers.RepeatedCompositeFieldContainer[RemoveFile]
    read_version: int
    operation: str
    operation_metrics: str
    rearranges_only: bool
    operation_parameters: str
    change_files: _containers.RepeatedCompositeFieldContainer[ChangeFile]
    read_set: str
    deletion_vectors: _containers.RepeatedCompositeFieldContainer[DeletionVectorUpdate]
    def __init__(self, table: _Optional[str] = ..., mode: _Optional[_Union[WriteMode, str]] = ..., add_files: _Optional[_Iterable[_Union[AddFile, _Mapping]]] = ..., schema_json: _Optional[str] = ..., partition_by: _Optional[_Iterable[str]] = ..., replace_partitions: _Optional[_Iterable[_Union[PartitionSpec, _Mapping]]] = ..., merge_schema: _Optional[bool] = ..., catalog_name: _Optional[str] = ..., remove_files: _Optional[_Iterable[_Union[RemoveFile, _Mapping]]] = ..., read_version: _Optional[int] = ..., operation: _Optional[str] = ..., operation_metrics: _Optional[str] = ..., rearranges_only: _Optional[bool] = ..., operation_parameters: _Optional[str] = ..., change_files: _Optional[_Iterable[_Union[ChangeFile, _Mapping]]] = ..., read_set: _Optional[str] = ..., deletion_vectors: _Optional[_Iterable[_Union[DeletionVectorUpdate, _Mapping]]] = ...) -> None: ...

class DeletionVectorUpdate(_message.Message):
    __slots__ = ("path", "vector_path", "vector_file_size", "offset", "size_in_bytes", "cardinality", "modification_time", "stats")
    PATH_FIELD_NUMBER: _ClassVar[int]
    VECTOR_PATH_FIELD_NUMBER: _ClassVar[int]
    VECTOR_FILE_SIZE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_IN_BYTES_FIELD_NUMBER: _ClassVar[int]
    CARDINALITY_FIELD_NUMBER: _ClassVar[int]
    MODIFICATION_TIME_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    path: str
    vector_path: str
    vector_file_size: int
    offset: int
    size_in_bytes: int
    cardinality: int
    modification_time: int
    stats: str
    def __init__(self, path: _Optional[str] = ..., vector_path: _Optional[str] = ..., vector_file_size: _Optional[int] = ..., offset: _Optional[int] = ..., size_in_bytes: _Optional[int] = ..., cardinality: _Optional[int] = ..., modification_time: _Optional[int] = ..., stats: _Optional[str] = ...) -> None: ...

class ChangeFile(_message.Message):
    __slots__ = ("path", "size", "partition_values", "null_partition_columns")
    class PartitionValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_PARTITION_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    partition_values: _containers.ScalarMap[str, str]
    null_partition_columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., partition_values: _Optional[_Mapping[str, str]] = ..., null_partition_columns: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveFile(_message.Message):
    __slots__ = ("path", "size", "partition_values", "null_partition_columns")
    class PartitionValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_PARTITION_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    path: str
    size: int
    partition_values: _containers.ScalarMap[str, str]
    null_partition_columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, path: _Optional[str] = ..., size: _Optional[int] = ..., partition_values: _Optional[_Mapping[str, str]] = ..., null_partition_columns: _Optional[_Iterable[str]] = ...) -> None: ...

class PartitionSpec(_message.Message):
    __slots__ = ("values", "null_columns")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    NULL_COLUMNS_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, str]
    null_columns: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Mapping[str, str]] = ..., null_columns: _Optional[_Iterable[str]] = ...) -> None: ...

class TableParticipant(_message.Message):
    __slots__ = ("table", "write_location", "prewritten", "mode", "file_count", "row_count", "applied", "delta_version", "write", "catalog_name", "abandoned")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    PREWRITTEN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    FILE_COUNT_FIELD_NUMBER: _ClassVar[int]
    ROW_COUNT_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    WRITE_FIELD_NUMBER: _ClassVar[int]
    CATALOG_NAME_FIELD_NUMBER: _ClassVar[int]
    ABANDONED_FIELD_NUMBER: _ClassVar[int]
    table: str
    write_location: str
    prewritten: bool
    mode: WriteMode
    file_count: int
    row_count: int
    applied: bool
    delta_version: int
    write: TableWrite
    catalog_name: str
    abandoned: bool
    def __init__(self, table: _Optional[str] = ..., write_location: _Optional[str] = ..., prewritten: _Optional[bool] = ..., mode: _Optional[_Union[WriteMode, str]] = ..., file_count: _Optional[int] = ..., row_count: _Optional[int] = ..., applied: _Optional[bool] = ..., delta_version: _Optional[int] = ..., write: _Optional[_Union[TableWrite, _Mapping]] = ..., catalog_name: _Optional[str] = ..., abandoned: _Optional[bool] = ...) -> None: ...

class Transaction(_message.Message):
    __slots__ = ("txn_id", "pipeline_id", "generation", "batch_id", "attempt", "state", "start_ts", "commit_ts", "participants", "epoch", "abort_reason", "created_unix_ms", "updated_unix_ms", "query_id", "principal", "waiting_for_table", "input_barrier", "source_offsets")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    START_TS_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    PARTICIPANTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ABORT_REASON_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    UPDATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    WAITING_FOR_TABLE_FIELD_NUMBER: _ClassVar[int]
    INPUT_BARRIER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    pipeline_id: str
    generation: int
    batch_id: int
    attempt: int
    state: TransactionState
    start_ts: int
    commit_ts: int
    participants: _containers.RepeatedCompositeFieldContainer[TableParticipant]
    epoch: int
    abort_reason: str
    created_unix_ms: int
    updated_unix_ms: int
    query_id: str
    principal: str
    waiting_for_table: str
    input_barrier: int
    source_offsets: str
    def __init__(self, txn_id: _Optional[str] = ..., pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., batch_id: _Optional[int] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[TransactionState, str]] = ..., start_ts: _Optional[int] = ..., commit_ts: _Optional[int] = ..., participants: _Optional[_Iterable[_Union[TableParticipant, _Mapping]]] = ..., epoch: _Optional[int] = ..., abort_reason: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., updated_unix_ms: _Optional[int] = ..., query_id: _Optional[str] = ..., principal: _Optional[str] = ..., waiting_for_table: _Optional[str] = ..., input_barrier: _Optional[int] = ..., source_offsets: _Optional[str] = ...) -> None: ...

class Pipeline(_message.Message):
    __slots__ = ("pipeline_id", "generation", "epoch", "query_id", "created_unix_ms", "last_commit_unix_ms", "resets", "last_committed_batch_id")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMIT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    RESETS_FIELD_NUMBER: _ClassVar[int]
    LAST_COMMITTED_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    epoch: int
    query_id: str
    created_unix_ms: int
    last_commit_unix_ms: int
    resets: _containers.RepeatedCompositeFieldContainer[PipelineReset]
    last_committed_batch_id: int
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., epoch: _Optional[int] = ..., query_id: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., last_commit_unix_ms: _Optional[int] = ..., resets: _Optional[_Iterable[_Union[PipelineReset, _Mapping]]] = ..., last_committed_batch_id: _Optional[int] = ...) -> None: ...

class PipelineReset(_message.Message):
    __slots__ = ("from_generation", "to_generation", "reason", "reset_unix_ms", "previous_query_id", "bound_query_id")
    FROM_GENERATION_FIELD_NUMBER: _ClassVar[int]
    TO_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    RESET_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    BOUND_QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    from_generation: int
    to_generation: int
    reason: str
    reset_unix_ms: int
    previous_query_id: str
    bound_query_id: str
    def __init__(self, from_generation: _Optional[int] = ..., to_generation: _Optional[int] = ..., reason: _Optional[str] = ..., reset_unix_ms: _Optional[int] = ..., previous_query_id: _Optional[str] = ..., bound_query_id: _Optional[str] = ...) -> None: ...

class RegisterPipelineRequest(_message.Message):
    __slots__ = ("pipeline_id", "query_id")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    query_id: str
    def __init__(self, pipeline_id: _Optional[str] = ..., query_id: _Optional[str] = ...) -> None: ...

class RegisterPipelineResponse(_message.Message):
    __slots__ = ("pipeline", "epoch", "generation")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    pipeline: Pipeline
    epoch: int
    generation: int
    def __init__(self, pipeline: _Optional[_Union[Pipeline, _Mapping]] = ..., epoch: _Optional[int] = ..., generation: _Optional[int] = ...) -> None: ...

class OpenTransactionRequest(_message.Message):
    __slots__ = ("pipeline_id", "batch_id", "epoch", "query_id", "tables", "timeout_ms", "applied_reports")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    APPLIED_REPORTS_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    batch_id: int
    epoch: int
    query_id: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    applied_reports: _containers.RepeatedCompositeFieldContainer[AppliedReport]
    def __init__(self, pipeline_id: _Optional[str] = ..., batch_id: _Optional[int] = ..., epoch: _Optional[int] = ..., query_id: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., applied_reports: _Optional[_Iterable[_Union[AppliedReport, _Mapping]]] = ...) -> None: ...

class AppliedReport(_message.Message):
    __slots__ = ("txn_id", "tables")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    tables: _containers.RepeatedCompositeFieldContainer[AppliedTable]
    def __init__(self, txn_id: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[AppliedTable, _Mapping]]] = ...) -> None: ...

class OpenTransactionResponse(_message.Message):
    __slots__ = ("transaction", "already_committed", "locations", "input_barrier", "input_after_barrier")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    ALREADY_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    INPUT_BARRIER_FIELD_NUMBER: _ClassVar[int]
    INPUT_AFTER_BARRIER_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    already_committed: bool
    locations: _containers.RepeatedCompositeFieldContainer[TableLocation]
    input_barrier: int
    input_after_barrier: int
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ..., already_committed: _Optional[bool] = ..., locations: _Optional[_Iterable[_Union[TableLocation, _Mapping]]] = ..., input_barrier: _Optional[int] = ..., input_after_barrier: _Optional[int] = ...) -> None: ...

class TableLocation(_message.Message):
    __slots__ = ("table", "write_location")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    WRITE_LOCATION_FIELD_NUMBER: _ClassVar[int]
    table: str
    write_location: str
    def __init__(self, table: _Optional[str] = ..., write_location: _Optional[str] = ...) -> None: ...

class DeclareTablesRequest(_message.Message):
    __slots__ = ("txn_id", "epoch", "tables")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ...) -> None: ...

class DeclareTablesResponse(_message.Message):
    __slots__ = ("transaction", "locations")
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    LOCATIONS_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    locations: _containers.RepeatedCompositeFieldContainer[TableLocation]
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ..., locations: _Optional[_Iterable[_Union[TableLocation, _Mapping]]] = ...) -> None: ...

class PrewriteRequest(_message.Message):
    __slots__ = ("txn_id", "epoch", "writes")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    writes: _containers.RepeatedCompositeFieldContainer[TableWrite]
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ..., writes: _Optional[_Iterable[_Union[TableWrite, _Mapping]]] = ...) -> None: ...

class PrewriteResponse(_message.Message):
    __slots__ = ("transaction",)
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ...) -> None: ...

class CommitTransactionRequest(_message.Message):
    __slots__ = ("txn_id", "epoch", "tables", "writes", "release_unwritten", "source_offsets")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    RELEASE_UNWRITTEN_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    tables: _containers.RepeatedScalarFieldContainer[str]
    writes: _containers.RepeatedCompositeFieldContainer[TableWrite]
    release_unwritten: bool
    source_offsets: str
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tables: _Optional[_Iterable[str]] = ..., writes: _Optional[_Iterable[_Union[TableWrite, _Mapping]]] = ..., release_unwritten: _Optional[bool] = ..., source_offsets: _Optional[str] = ...) -> None: ...

class CommitTransactionResponse(_message.Message):
    __slots__ = ("transaction",)
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ...) -> None: ...

class AbortTransactionRequest(_message.Message):
    __slots__ = ("txn_id", "epoch", "reason")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    reason: str
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class AbortTransactionResponse(_message.Message):
    __slots__ = ("transaction",)
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ...) -> None: ...

class AppliedTable(_message.Message):
    __slots__ = ("table", "delta_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    delta_version: int
    def __init__(self, table: _Optional[str] = ..., delta_version: _Optional[int] = ...) -> None: ...

class ReportAppliedRequest(_message.Message):
    __slots__ = ("txn_id", "epoch", "tables")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    tables: _containers.RepeatedCompositeFieldContainer[AppliedTable]
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[AppliedTable, _Mapping]]] = ...) -> None: ...

class ReportAppliedResponse(_message.Message):
    __slots__ = ("transaction",)
    TRANSACTION_FIELD_NUMBER: _ClassVar[int]
    transaction: Transaction
    def __init__(self, transaction: _Optional[_Union[Transaction, _Mapping]] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("txn_id", "epoch")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    epoch: int
    def __init__(self, txn_id: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("state", "expires_in_ms")
    STATE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    state: TransactionState
    expires_in_ms: int
    def __init__(self, state: _Optional[_Union[TransactionState, str]] = ..., expires_in_ms: _Optional[int] = ...) -> None: ...

class GetTransactionRequest(_message.Message):
    __slots__ = ("txn_id", "include_writes")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_WRITES_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    include_writes: bool
    def __init__(self, txn_id: _Optional[str] = ..., include_writes: _Optional[bool] = ...) -> None: ...

class ListTransactionsRequest(_message.Message):
    __slots__ = ("pipeline_id", "generation", "states", "batch_id", "created_after_unix_ms", "created_before_unix_ms", "page_size", "page_token")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATES_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    states: _containers.RepeatedScalarFieldContainer[TransactionState]
    batch_id: int
    created_after_unix_ms: int
    created_before_unix_ms: int
    page_size: int
    page_token: str
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., states: _Optional[_Iterable[_Union[TransactionState, str]]] = ..., batch_id: _Optional[int] = ..., created_after_unix_ms: _Optional[int] = ..., created_before_unix_ms: _Optional[int] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListTransactionsResponse(_message.Message):
    __slots__ = ("transactions", "next_page_token")
    TRANSACTIONS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    transactions: _containers.RepeatedCompositeFieldContainer[Transaction]
    next_page_token: str
    def __init__(self, transactions: _Optional[_Iterable[_Union[Transaction, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class BatchRef(_message.Message):
    __slots__ = ("pipeline_id", "generation", "batch_id")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    batch_id: int
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., batch_id: _Optional[int] = ...) -> None: ...

class GetSnapshotRequest(_message.Message):
    __slots__ = ("tables", "as_of_ts", "as_of_batch", "as_of_barrier", "wait_timeout_ms", "consistency", "lease_ms", "lease_holder")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    AS_OF_TS_FIELD_NUMBER: _ClassVar[int]
    AS_OF_BATCH_FIELD_NUMBER: _ClassVar[int]
    AS_OF_BARRIER_FIELD_NUMBER: _ClassVar[int]
    WAIT_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_HOLDER_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    as_of_ts: int
    as_of_batch: BatchRef
    as_of_barrier: int
    wait_timeout_ms: int
    consistency: Consistency
    lease_ms: int
    lease_holder: str
    def __init__(self, tables: _Optional[_Iterable[str]] = ..., as_of_ts: _Optional[int] = ..., as_of_batch: _Optional[_Union[BatchRef, _Mapping]] = ..., as_of_barrier: _Optional[int] = ..., wait_timeout_ms: _Optional[int] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., lease_ms: _Optional[int] = ..., lease_holder: _Optional[str] = ...) -> None: ...

class TableVersion(_message.Message):
    __slots__ = ("table", "canonical_table", "exists", "delta_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    CANONICAL_TABLE_FIELD_NUMBER: _ClassVar[int]
    EXISTS_FIELD_NUMBER: _ClassVar[int]
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    canonical_table: str
    exists: bool
    delta_version: int
    def __init__(self, table: _Optional[str] = ..., canonical_table: _Optional[str] = ..., exists: _Optional[bool] = ..., delta_version: _Optional[int] = ...) -> None: ...

class GetSnapshotResponse(_message.Message):
    __slots__ = ("snapshot_ts", "tables", "consistency", "barrier_ts", "lease", "revised_ts")
    SNAPSHOT_TS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    CONSISTENCY_FIELD_NUMBER: _ClassVar[int]
    BARRIER_TS_FIELD_NUMBER: _ClassVar[int]
    LEASE_FIELD_NUMBER: _ClassVar[int]
    REVISED_TS_FIELD_NUMBER: _ClassVar[int]
    snapshot_ts: int
    tables: _containers.RepeatedCompositeFieldContainer[TableVersion]
    consistency: Consistency
    barrier_ts: int
    lease: Lease
    revised_ts: int
    def __init__(self, snapshot_ts: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[TableVersion, _Mapping]]] = ..., consistency: _Optional[_Union[Consistency, str]] = ..., barrier_ts: _Optional[int] = ..., lease: _Optional[_Union[Lease, _Mapping]] = ..., revised_ts: _Optional[int] = ...) -> None: ...

class GetPipelineRequest(_message.Message):
    __slots__ = ("pipeline_id",)
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    def __init__(self, pipeline_id: _Optional[str] = ...) -> None: ...

class ListPipelinesRequest(_message.Message):
    __slots__ = ("page_token", "page_size")
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    page_token: str
    page_size: int
    def __init__(self, page_token: _Optional[str] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListPipelinesResponse(_message.Message):
    __slots__ = ("pipelines", "next_page_token")
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    pipelines: _containers.RepeatedCompositeFieldContainer[Pipeline]
    next_page_token: str
    def __init__(self, pipelines: _Optional[_Iterable[_Union[Pipeline, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class ResetPipelineRequest(_message.Message):
    __slots__ = ("pipeline_id", "reason", "expected_generation", "require_idle", "query_id", "start_barrier")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REQUIRE_IDLE_FIELD_NUMBER: _ClassVar[int]
    QUERY_ID_FIELD_NUMBER: _ClassVar[int]
    START_BARRIER_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    reason: str
    expected_generation: int
    require_idle: bool
    query_id: str
    start_barrier: int
    def __init__(self, pipeline_id: _Optional[str] = ..., reason: _Optional[str] = ..., expected_generation: _Optional[int] = ..., require_idle: _Optional[bool] = ..., query_id: _Optional[str] = ..., start_barrier: _Optional[int] = ...) -> None: ...

class ResetPipelineResponse(_message.Message):
    __slots__ = ("pipeline", "changed", "aborted_txn_ids")
    PIPELINE_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    ABORTED_TXN_IDS_FIELD_NUMBER: _ClassVar[int]
    pipeline: Pipeline
    changed: bool
    aborted_txn_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, pipeline: _Optional[_Union[Pipeline, _Mapping]] = ..., changed: _Optional[bool] = ..., aborted_txn_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AclEntry(_message.Message):
    __slots__ = ("principal", "resource_type", "pattern", "permission", "created_unix_ms")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    principal: str
    resource_type: ResourceType
    pattern: str
    permission: Permission
    created_unix_ms: int
    def __init__(self, principal: _Optional[str] = ..., resource_type: _Optional[_Union[ResourceType, str]] = ..., pattern: _Optional[str] = ..., permission: _Optional[_Union[Permission, str]] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class AclRequest(_message.Message):
    __slots__ = ("entry",)
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    entry: AclEntry
    def __init__(self, entry: _Optional[_Union[AclEntry, _Mapping]] = ...) -> None: ...

class AclChangeResponse(_message.Message):
    __slots__ = ("entry", "changed")
    ENTRY_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    entry: AclEntry
    changed: bool
    def __init__(self, entry: _Optional[_Union[AclEntry, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ListAclsRequest(_message.Message):
    __slots__ = ("principal",)
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    principal: str
    def __init__(self, principal: _Optional[str] = ...) -> None: ...

class ListAclsResponse(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[AclEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[AclEntry, _Mapping]]] = ...) -> None: ...

class Token(_message.Message):
    __slots__ = ("token_id", "principal", "created_unix_ms", "revoked_unix_ms", "description")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    principal: str
    created_unix_ms: int
    revoked_unix_ms: int
    description: str
    def __init__(self, token_id: _Optional[str] = ..., principal: _Optional[str] = ..., created_unix_ms: _Optional[int] = ..., revoked_unix_ms: _Optional[int] = ..., description: _Optional[str] = ...) -> None: ...

class CreateTokenRequest(_message.Message):
    __slots__ = ("principal", "description")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    principal: str
    description: str
    def __init__(self, principal: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class CreateTokenResponse(_message.Message):
    __slots__ = ("token", "bearer_token")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BEARER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: Token
    bearer_token: str
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., bearer_token: _Optional[str] = ...) -> None: ...

class RevokeTokenRequest(_message.Message):
    __slots__ = ("token_id",)
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    token_id: str
    def __init__(self, token_id: _Optional[str] = ...) -> None: ...

class RevokeTokenResponse(_message.Message):
    __slots__ = ("token", "changed")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    token: Token
    changed: bool
    def __init__(self, token: _Optional[_Union[Token, _Mapping]] = ..., changed: _Optional[bool] = ...) -> None: ...

class ListTokensRequest(_message.Message):
    __slots__ = ("principal", "include_revoked")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REVOKED_FIELD_NUMBER: _ClassVar[int]
    principal: str
    include_revoked: bool
    def __init__(self, principal: _Optional[str] = ..., include_revoked: _Optional[bool] = ...) -> None: ...

class ListTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[Token]
    def __init__(self, tokens: _Optional[_Iterable[_Union[Token, _Mapping]]] = ...) -> None: ...

class RegisterReadsRequest(_message.Message):
    __slots__ = ("pipeline_id", "tables", "epoch")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    tables: _containers.RepeatedScalarFieldContainer[str]
    epoch: int
    def __init__(self, pipeline_id: _Optional[str] = ..., tables: _Optional[_Iterable[str]] = ..., epoch: _Optional[int] = ...) -> None: ...

class RegisterReadsResponse(_message.Message):
    __slots__ = ("tables", "added")
    TABLES_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    added: int
    def __init__(self, tables: _Optional[_Iterable[str]] = ..., added: _Optional[int] = ...) -> None: ...

class GetTopologyRequest(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tables: _Optional[_Iterable[str]] = ...) -> None: ...

class TopologyEdge(_message.Message):
    __slots__ = ("pipeline_id", "table", "kind")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    TABLE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    table: str
    kind: EdgeKind
    def __init__(self, pipeline_id: _Optional[str] = ..., table: _Optional[str] = ..., kind: _Optional[_Union[EdgeKind, str]] = ...) -> None: ...

class TopologyPipeline(_message.Message):
    __slots__ = ("pipeline_id", "generation", "root", "reads", "writes", "own_delay_ms", "end_to_end_delay_ms", "last_input_barrier_ts")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    READS_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    OWN_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    END_TO_END_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LAST_INPUT_BARRIER_TS_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    root: bool
    reads: _containers.RepeatedScalarFieldContainer[str]
    writes: _containers.RepeatedScalarFieldContainer[str]
    own_delay_ms: int
    end_to_end_delay_ms: int
    last_input_barrier_ts: int
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., root: _Optional[bool] = ..., reads: _Optional[_Iterable[str]] = ..., writes: _Optional[_Iterable[str]] = ..., own_delay_ms: _Optional[int] = ..., end_to_end_delay_ms: _Optional[int] = ..., last_input_barrier_ts: _Optional[int] = ...) -> None: ...

class TopologyTable(_message.Message):
    __slots__ = ("table", "writer", "readers", "completed_barrier_ts", "completed_barrier_unix_ms", "delay_ms", "bottleneck_pipeline", "bottleneck_delay_ms")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    WRITER_FIELD_NUMBER: _ClassVar[int]
    READERS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_BARRIER_TS_FIELD_NUMBER: _ClassVar[int]
    COMPLETED_BARRIER_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    BOTTLENECK_PIPELINE_FIELD_NUMBER: _ClassVar[int]
    BOTTLENECK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    table: str
    writer: str
    readers: _containers.RepeatedScalarFieldContainer[str]
    completed_barrier_ts: int
    completed_barrier_unix_ms: int
    delay_ms: int
    bottleneck_pipeline: str
    bottleneck_delay_ms: int
    def __init__(self, table: _Optional[str] = ..., writer: _Optional[str] = ..., readers: _Optional[_Iterable[str]] = ..., completed_barrier_ts: _Optional[int] = ..., completed_barrier_unix_ms: _Optional[int] = ..., delay_ms: _Optional[int] = ..., bottleneck_pipeline: _Optional[str] = ..., bottleneck_delay_ms: _Optional[int] = ...) -> None: ...

class GetTopologyResponse(_message.Message):
    __slots__ = ("pipelines", "tables", "edges", "barrier_interval_ms", "now_ts", "now_unix_ms")
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    EDGES_FIELD_NUMBER: _ClassVar[int]
    BARRIER_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    NOW_TS_FIELD_NUMBER: _ClassVar[int]
    NOW_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    pipelines: _containers.RepeatedCompositeFieldContainer[TopologyPipeline]
    tables: _containers.RepeatedCompositeFieldContainer[TopologyTable]
    edges: _containers.RepeatedCompositeFieldContainer[TopologyEdge]
    barrier_interval_ms: int
    now_ts: int
    now_unix_ms: int
    def __init__(self, pipelines: _Optional[_Iterable[_Union[TopologyPipeline, _Mapping]]] = ..., tables: _Optional[_Iterable[_Union[TopologyTable, _Mapping]]] = ..., edges: _Optional[_Iterable[_Union[TopologyEdge, _Mapping]]] = ..., barrier_interval_ms: _Optional[int] = ..., now_ts: _Optional[int] = ..., now_unix_ms: _Optional[int] = ...) -> None: ...

class PlanBarrierRequest(_message.Message):
    __slots__ = ("pipeline_id", "generation", "after_barrier", "round")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    AFTER_BARRIER_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    after_barrier: int
    round: int
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., after_barrier: _Optional[int] = ..., round: _Optional[int] = ...) -> None: ...

class PlanBarrierResponse(_message.Message):
    __slots__ = ("generation", "start_barrier", "after_barrier", "barrier", "has_changes")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    START_BARRIER_FIELD_NUMBER: _ClassVar[int]
    AFTER_BARRIER_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    HAS_CHANGES_FIELD_NUMBER: _ClassVar[int]
    generation: int
    start_barrier: int
    after_barrier: int
    barrier: int
    has_changes: bool
    def __init__(self, generation: _Optional[int] = ..., start_barrier: _Optional[int] = ..., after_barrier: _Optional[int] = ..., barrier: _Optional[int] = ..., has_changes: _Optional[bool] = ...) -> None: ...

class GetTableChangesRequest(_message.Message):
    __slots__ = ("table", "after_barrier", "upto_barrier")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    AFTER_BARRIER_FIELD_NUMBER: _ClassVar[int]
    UPTO_BARRIER_FIELD_NUMBER: _ClassVar[int]
    table: str
    after_barrier: int
    upto_barrier: int
    def __init__(self, table: _Optional[str] = ..., after_barrier: _Optional[int] = ..., upto_barrier: _Optional[int] = ...) -> None: ...

class TableChange(_message.Message):
    __slots__ = ("delta_version", "commit_ts", "barrier", "txn_id")
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TS_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    delta_version: int
    commit_ts: int
    barrier: int
    txn_id: str
    def __init__(self, delta_version: _Optional[int] = ..., commit_ts: _Optional[int] = ..., barrier: _Optional[int] = ..., txn_id: _Optional[str] = ...) -> None: ...

class GetTableChangesResponse(_message.Message):
    __slots__ = ("canonical_table", "changes", "version_at_after")
    CANONICAL_TABLE_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    VERSION_AT_AFTER_FIELD_NUMBER: _ClassVar[int]
    canonical_table: str
    changes: _containers.RepeatedCompositeFieldContainer[TableChange]
    version_at_after: int
    def __init__(self, canonical_table: _Optional[str] = ..., changes: _Optional[_Iterable[_Union[TableChange, _Mapping]]] = ..., version_at_after: _Optional[int] = ...) -> None: ...

class Lease(_message.Message):
    __slots__ = ("lease_id", "holder", "tables", "barrier_ts", "created_unix_ms", "expires_unix_ms")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    BARRIER_TS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    holder: str
    tables: _containers.RepeatedCompositeFieldContainer[TableVersion]
    barrier_ts: int
    created_unix_ms: int
    expires_unix_ms: int
    def __init__(self, lease_id: _Optional[str] = ..., holder: _Optional[str] = ..., tables: _Optional[_Iterable[_Union[TableVersion, _Mapping]]] = ..., barrier_ts: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., expires_unix_ms: _Optional[int] = ...) -> None: ...

class ReleaseLeaseRequest(_message.Message):
    __slots__ = ("lease_id",)
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    def __init__(self, lease_id: _Optional[str] = ...) -> None: ...

class ReleaseLeaseResponse(_message.Message):
    __slots__ = ("released",)
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    released: bool
    def __init__(self, released: _Optional[bool] = ...) -> None: ...

class ListLeasesRequest(_message.Message):
    __slots__ = ("tables",)
    TABLES_FIELD_NUMBER: _ClassVar[int]
    tables: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tables: _Optional[_Iterable[str]] = ...) -> None: ...

class ListLeasesResponse(_message.Message):
    __slots__ = ("leases",)
    LEASES_FIELD_NUMBER: _ClassVar[int]
    leases: _containers.RepeatedCompositeFieldContainer[Lease]
    def __init__(self, leases: _Optional[_Iterable[_Union[Lease, _Mapping]]] = ...) -> None: ...

class VacuumRequest(_message.Message):
    __slots__ = ("table", "retention_hours", "dry_run")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    RETENTION_HOURS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    table: str
    retention_hours: int
    dry_run: bool
    def __init__(self, table: _Optional[str] = ..., retention_hours: _Optional[int] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class VacuumResponse(_message.Message):
    __slots__ = ("canonical_table", "removed_files", "oldest_needed_version", "kept_for")
    CANONICAL_TABLE_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FILES_FIELD_NUMBER: _ClassVar[int]
    OLDEST_NEEDED_VERSION_FIELD_NUMBER: _ClassVar[int]
    KEPT_FOR_FIELD_NUMBER: _ClassVar[int]
    canonical_table: str
    removed_files: _containers.RepeatedScalarFieldContainer[str]
    oldest_needed_version: int
    kept_for: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, canonical_table: _Optional[str] = ..., removed_files: _Optional[_Iterable[str]] = ..., oldest_needed_version: _Optional[int] = ..., kept_for: _Optional[_Iterable[str]] = ...) -> None: ...

class TableQuarantine(_message.Message):
    __slots__ = ("table", "txn_id", "reason", "quarantined_unix_ms", "choice", "chosen_by", "chosen_unix_ms", "choice_reason", "as_of_version", "released_unix_ms", "delta_version")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUARANTINED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_BY_FIELD_NUMBER: _ClassVar[int]
    CHOSEN_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    CHOICE_REASON_FIELD_NUMBER: _ClassVar[int]
    AS_OF_VERSION_FIELD_NUMBER: _ClassVar[int]
    RELEASED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    table: str
    txn_id: str
    reason: str
    quarantined_unix_ms: int
    choice: QuarantineChoice
    chosen_by: str
    chosen_unix_ms: int
    choice_reason: str
    as_of_version: int
    released_unix_ms: int
    delta_version: int
    def __init__(self, table: _Optional[str] = ..., txn_id: _Optional[str] = ..., reason: _Optional[str] = ..., quarantined_unix_ms: _Optional[int] = ..., choice: _Optional[_Union[QuarantineChoice, str]] = ..., chosen_by: _Optional[str] = ..., chosen_unix_ms: _Optional[int] = ..., choice_reason: _Optional[str] = ..., as_of_version: _Optional[int] = ..., released_unix_ms: _Optional[int] = ..., delta_version: _Optional[int] = ...) -> None: ...

class ListQuarantinesRequest(_message.Message):
    __slots__ = ("pipeline_id", "include_released")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_RELEASED_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    include_released: bool
    def __init__(self, pipeline_id: _Optional[str] = ..., include_released: _Optional[bool] = ...) -> None: ...

class ListQuarantinesResponse(_message.Message):
    __slots__ = ("quarantines",)
    QUARANTINES_FIELD_NUMBER: _ClassVar[int]
    quarantines: _containers.RepeatedCompositeFieldContainer[TableQuarantine]
    def __init__(self, quarantines: _Optional[_Iterable[_Union[TableQuarantine, _Mapping]]] = ...) -> None: ...

class ReleaseQuarantineRequest(_message.Message):
    __slots__ = ("table", "txn_id", "choice", "reason")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    table: str
    txn_id: str
    choice: QuarantineChoice
    reason: str
    def __init__(self, table: _Optional[str] = ..., txn_id: _Optional[str] = ..., choice: _Optional[_Union[QuarantineChoice, str]] = ..., reason: _Optional[str] = ...) -> None: ...

class ReviseRequest(_message.Message):
    __slots__ = ("table", "to_barrier", "reason")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    TO_BARRIER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    table: str
    to_barrier: int
    reason: str
    def __init__(self, table: _Optional[str] = ..., to_barrier: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RevisedTable(_message.Message):
    __slots__ = ("table", "restored_version", "delta_version", "existed")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    RESTORED_VERSION_FIELD_NUMBER: _ClassVar[int]
    DELTA_VERSION_FIELD_NUMBER: _ClassVar[int]
    EXISTED_FIELD_NUMBER: _ClassVar[int]
    table: str
    restored_version: int
    delta_version: int
    existed: bool
    def __init__(self, table: _Optional[str] = ..., restored_version: _Optional[int] = ..., delta_version: _Optional[int] = ..., existed: _Optional[bool] = ...) -> None: ...

class RevisedPipeline(_message.Message):
    __slots__ = ("pipeline_id", "generation", "start_barrier")
    PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    START_BARRIER_FIELD_NUMBER: _ClassVar[int]
    pipeline_id: str
    generation: int
    start_barrier: int
    def __init__(self, pipeline_id: _Optional[str] = ..., generation: _Optional[int] = ..., start_barrier: _Optional[int] = ...) -> None: ...

class ReviseResponse(_message.Message):
    __slots__ = ("txn_id", "revision_ts", "tables", "pipelines", "root_pipeline_id", "root_batch_id", "root_source_offsets", "derived", "writing_pipeline_id")
    TXN_ID_FIELD_NUMBER: _ClassVar[int]
    REVISION_TS_FIELD_NUMBER: _ClassVar[int]
    TABLES_FIELD_NUMBER: _ClassVar[int]
    PIPELINES_FIELD_NUMBER: _ClassVar[int]
    ROOT_PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ROOT_SOURCE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    DERIVED_FIELD_NUMBER: _ClassVar[int]
    WRITING_PIPELINE_ID_FIELD_NUMBER: _ClassVar[int]
    txn_id: str
    revision_ts: int
    tables: _containers.RepeatedCompositeFieldContainer[RevisedTable]
    pipelines: _containers.RepeatedCompositeFieldContainer[RevisedPipeline]
    root_pipeline_id: str
    root_batch_id: int
    root_source_offsets: str
    derived: bool
    writing_pipeline_id: str
    def __init__(self, txn_id: _Optional[str] = ..., revision_ts: _Optional[int] = ..., tables: _Optional[_Iterable[_Union[RevisedTable, _Mapping]]] = ..., pipelines: _Optional[_Iterable[_Union[RevisedPipeline, _Mapping]]] = ..., root_pipeline_id: _Optional[str] = ..., root_batch_id: _Optional[int] = ..., root_source_offsets: _Optional[str] = ..., derived: _Optional[bool] = ..., writing_pipeline_id: _Optional[str] = ...) -> None: ...
