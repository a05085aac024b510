from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_STATE_UNSPECIFIED: _ClassVar[ShardState]
    SHARD_STATE_STARTING: _ClassVar[ShardState]
    SHARD_STATE_READY: _ClassVar[ShardState]
    SHARD_STATE_FAILED: _ClassVar[ShardState]
    SHARD_STATE_STOPPING: _ClassVar[ShardState]
    SHARD_STATE_STOPPED: _ClassVar[ShardState]
SHARD_STATE_UNSPECIFIED: ShardState
SHARD_STATE_STARTING: ShardState
SHARD_STATE_READY: ShardState
SHARD_STATE_FAILED: ShardState
SHARD_STATE_STOPPING: ShardState
SHARD_STATE_STOPPED: ShardState

class AgentMessage(_message.Message):
    __slots__ = ("seq", "register", "heartbeat", "shard_status", "ack")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    register: Register
    heartbeat: Heartbeat
    shard_status: ShardStatus
    ack: Ack
    def __init__(self, seq: _Optional[int] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shard_status: _Optional[_Union[ShardStatus, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("seq", "start_shard", "stop_shard", "ack")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    START_SHARD_FIELD_NUMBER: _ClassVar[int]
    STOP_SHARD_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    seq: int
    start_shard: StartShard
    stop_shard: StopShard
    ack: Ack
    def __init__(self, seq: _Optional[int] = ..., start_shard: _Optional[_Union[StartShard, _Mapping]] = ..., stop_shard: _Optional[_Union[StopShard, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "hostname", "agent_version", "inventory", "shards", "mgmt_addr", "labels", "engines")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTNAME_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    MGMT_ADDR_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    agent_version: str
    inventory: Inventory
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    mgmt_addr: str
    labels: _containers.ScalarMap[str, str]
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., mgmt_addr: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("cpu_count", "memory_total_bytes", "memory_available_bytes", "disks", "gpus", "os", "arch")
    CPU_COUNT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    OS_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    disks: _containers.RepeatedCompositeFieldContainer[Disk]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    os: str
    arch: str
    def __init__(self, cpu_count: _Optional[int] = ..., memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., disks: _Optional[_Iterable[_Union[Disk, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., os: _Optional[str] = ..., arch: _Optional[str] = ...) -> None: ...

class Disk(_message.Message):
    __slots__ = ("path", "total_bytes", "free_bytes")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    path: str
    total_bytes: int
    free_bytes: int
    def __init__(self, path: _Optional[str] = ..., total_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_total_bytes", "memory_used_bytes", "compute_capability")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., compute_capability: _Optional[str] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("memory_total_bytes", "memory_available_bytes", "cpu_percent", "load1", "gpus", "disks")
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    memory_total_bytes: int
    memory_available_bytes: int
    cpu_percent: float
    load1: float
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    disks: _containers.RepeatedCompositeFieldContainer[Disk]
    def __init__(self, memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., load1: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., disks: _Optional[_Iterable[_Union[Disk, _Mapping]]] = ...) -> None: ...

class ShardSpec(_message.Message):
    __slots__ = ("shard_id", "replica_id", "model", "engine", "served_name", "source", "args", "port", "api_key", "threads", "memory_bytes", "startup_timeout_s", "env")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SERVED_NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ARGS_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FIELD_NUMBER: _ClassVar[int]
    THREADS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STARTUP_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    replica_id: str
    model: str
    engine: str
    served_name: str
    source: str
    args: _containers.RepeatedScalarFieldContainer[str]
    port: int
    api_key: str
    threads: int
    memory_bytes: int
    startup_timeout_s: int
    env: _containers.ScalarMap[str, str]
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., served_name: _Optional[str] = ..., source: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., port: _Optional[int] = ..., api_key: _Optional[str] = ..., threads: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., startup_timeout_s: _Optional[int] = ..., env: _Optional[_Mapping[str, str]] = ...) -> None: ...

class StartShard(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: ShardSpec
    def __init__(self, spec: _Optional[_Union[ShardSpec, _Mapping]] = ...) -> None: ...

class StopShard(_message.Message):
    __slots__ = ("shard_id", "grace_s", "reason")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    grace_s: int
    reason: str
    def __init__(self, shard_id: _Optional[str] = ..., grace_s: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard_id", "replica_id", "state", "message", "exited", "exit_code", "last_output", "endpoint", "pid", "spec")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    EXITED_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODE_FIELD_NUMBER: _ClassVar[int]
    LAST_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    replica_id: str
    state: ShardState
    message: str
    exited: bool
    exit_code: int
    last_output: _containers.RepeatedScalarFieldContainer[str]
    endpoint: str
    pid: int
    spec: ShardSpec
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., state: _Optional[_Union[ShardState, str]] = ..., message: _Optional[str] = ..., exited: bool = ..., exit_code: _Optional[int] = ..., last_output: _Optional[_Iterable[str]] = ..., endpoint: _Optional[str] = ..., pid: _Optional[int] = ..., spec: _Optional[_Union[ShardSpec, _Mapping]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "ok", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ok: bool
    error: str
    def __init__(self, seq: _Optional[int] = ..., ok: bool = ..., error: _Optional[str] = ...) -> None: ...
