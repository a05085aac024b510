from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CertPurpose(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CERT_PURPOSE_NODE: _ClassVar[CertPurpose]
    CERT_PURPOSE_ENGINE: _ClassVar[CertPurpose]

class UpgradeState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    UPGRADE_STATE_UNSPECIFIED: _ClassVar[UpgradeState]
    UPGRADE_INSTALLING: _ClassVar[UpgradeState]
    UPGRADE_RESTARTING: _ClassVar[UpgradeState]
    UPGRADE_FAILED: _ClassVar[UpgradeState]

class ShardState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARD_STATE_UNSPECIFIED: _ClassVar[ShardState]
    SHARD_STATE_STARTING: _ClassVar[ShardState]
    SHARD_STATE_READY: _ClassVar[ShardState]
    SHARD_STATE_FAILED: _ClassVar[ShardState]
    SHARD_STATE_STOPPING: _ClassVar[ShardState]
    SHARD_STATE_STOPPED: _ClassVar[ShardState]
    SHARD_STATE_DRAINING: _ClassVar[ShardState]
    SHARD_STATE_DRAINED: _ClassVar[ShardState]
    SHARD_STATE_UNHEALTHY: _ClassVar[ShardState]
    SHARD_STATE_FETCHING: _ClassVar[ShardState]

class InstallState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    INSTALL_STATE_UNSPECIFIED: _ClassVar[InstallState]
    INSTALLING: _ClassVar[InstallState]
    INSTALL_READY: _ClassVar[InstallState]
    INSTALL_FAILED: _ClassVar[InstallState]
    INSTALL_UNSUPPORTED: _ClassVar[InstallState]
CERT_PURPOSE_NODE: CertPurpose
CERT_PURPOSE_ENGINE: CertPurpose
UPGRADE_STATE_UNSPECIFIED: UpgradeState
UPGRADE_INSTALLING: UpgradeState
UPGRADE_RESTARTING: UpgradeState
UPGRADE_FAILED: UpgradeState
SHARD_STATE_UNSPECIFIED: ShardState
SHARD_STATE_STARTING: ShardState
SHARD_STATE_READY: ShardState
SHARD_STATE_FAILED: ShardState
SHARD_STATE_STOPPING: ShardState
SHARD_STATE_STOPPED: ShardState
SHARD_STATE_DRAINING: ShardState
SHARD_STATE_DRAINED: ShardState
SHARD_STATE_UNHEALTHY: ShardState
SHARD_STATE_FETCHING: ShardState
INSTALL_STATE_UNSPECIFIED: InstallState
INSTALLING: InstallState
INSTALL_READY: InstallState
INSTALL_FAILED: InstallState
INSTALL_UNSUPPORTED: InstallState

class JoinRequest(_message.Message):
    __slots__ = ("token", "csr_pem", "node_id")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    token: str
    csr_pem: bytes
    node_id: str
    def __init__(self, token: _Optional[str] = ..., csr_pem: _Optional[bytes] = ..., node_id: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("cert_pem", "ca_pem", "node_id", "agent_port")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_PORT_FIELD_NUMBER: _ClassVar[int]
    cert_pem: bytes
    ca_pem: bytes
    node_id: str
    agent_port: int
    def __init__(self, cert_pem: _Optional[bytes] = ..., ca_pem: _Optional[bytes] = ..., node_id: _Optional[str] = ..., agent_port: _Optional[int] = ...) -> None: ...

class RenewCert(_message.Message):
    __slots__ = ("csr_pem", "purpose")
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    csr_pem: bytes
    purpose: CertPurpose
    def __init__(self, csr_pem: _Optional[bytes] = ..., purpose: _Optional[_Union[CertPurpose, str]] = ...) -> None: ...

class CertIssued(_message.Message):
    __slots__ = ("cert_pem", "error", "purpose")
    CERT_PEM_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    cert_pem: bytes
    error: str
    purpose: CertPurpose
    def __init__(self, cert_pem: _Optional[bytes] = ..., error: _Optional[str] = ..., purpose: _Optional[_Union[CertPurpose, str]] = ...) -> None: ...

class AgentMessage(_message.Message):
    __slots__ = ("seq", "register", "heartbeat", "shard_status", "ack", "logs_reply", "renew_cert", "fabric_result", "goodbye", "upgrade_status", "kv_digest")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    SHARD_STATUS_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    LOGS_REPLY_FIELD_NUMBER: _ClassVar[int]
    RENEW_CERT_FIELD_NUMBER: _ClassVar[int]
    FABRIC_RESULT_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_STATUS_FIELD_NUMBER: _ClassVar[int]
    KV_DIGEST_FIELD_NUMBER: _ClassVar[int]
    seq: int
    register: Register
    heartbeat: Heartbeat
    shard_status: ShardStatus
    ack: Ack
    logs_reply: LogsReply
    renew_cert: RenewCert
    fabric_result: FabricTestResult
    goodbye: Goodbye
    upgrade_status: UpgradeStatus
    kv_digest: KvDigest
    def __init__(self, seq: _Optional[int] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., shard_status: _Optional[_Union[ShardStatus, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., logs_reply: _Optional[_Union[LogsReply, _Mapping]] = ..., renew_cert: _Optional[_Union[RenewCert, _Mapping]] = ..., fabric_result: _Optional[_Union[FabricTestResult, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., upgrade_status: _Optional[_Union[UpgradeStatus, _Mapping]] = ..., kv_digest: _Optional[_Union[KvDigest, _Mapping]] = ...) -> None: ...

class KvDigest(_message.Message):
    __slots__ = ("replica_id", "epoch", "seq", "block_size", "hash_algo", "hash_seed", "added", "removed", "full")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASH_ALGO_FIELD_NUMBER: _ClassVar[int]
    HASH_SEED_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    FULL_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    epoch: int
    seq: int
    block_size: int
    hash_algo: str
    hash_seed: str
    added: _containers.RepeatedScalarFieldContainer[int]
    removed: _containers.RepeatedScalarFieldContainer[int]
    full: bool
    def __init__(self, replica_id: _Optional[str] = ..., epoch: _Optional[int] = ..., seq: _Optional[int] = ..., block_size: _Optional[int] = ..., hash_algo: _Optional[str] = ..., hash_seed: _Optional[str] = ..., added: _Optional[_Iterable[int]] = ..., removed: _Optional[_Iterable[int]] = ..., full: bool = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("seq", "term", "start_shard", "stop_shard", "ack", "drain", "logs_request", "logs_cancel", "remove_weights", "cert_issued", "provision", "fabric_test", "controlplanes", "upgrade_agent", "sleep_shard", "tunnel_offer")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    START_SHARD_FIELD_NUMBER: _ClassVar[int]
    STOP_SHARD_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    LOGS_REQUEST_FIELD_NUMBER: _ClassVar[int]
    LOGS_CANCEL_FIELD_NUMBER: _ClassVar[int]
    REMOVE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    CERT_ISSUED_FIELD_NUMBER: _ClassVar[int]
    PROVISION_FIELD_NUMBER: _ClassVar[int]
    FABRIC_TEST_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANES_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_AGENT_FIELD_NUMBER: _ClassVar[int]
    SLEEP_SHARD_FIELD_NUMBER: _ClassVar[int]
    TUNNEL_OFFER_FIELD_NUMBER: _ClassVar[int]
    seq: int
    term: int
    start_shard: StartShard
    stop_shard: StopShard
    ack: Ack
    drain: Drain
    logs_request: LogsRequest
    logs_cancel: LogsCancel
    remove_weights: RemoveWeights
    cert_issued: CertIssued
    provision: Provision
    fabric_test: FabricTestRequest
    controlplanes: ControlPlanes
    upgrade_agent: UpgradeAgent
    sleep_shard: SleepShard
    tunnel_offer: TunnelOffer
    def __init__(self, seq: _Optional[int] = ..., term: _Optional[int] = ..., start_shard: _Optional[_Union[StartShard, _Mapping]] = ..., stop_shard: _Optional[_Union[StopShard, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., logs_request: _Optional[_Union[LogsRequest, _Mapping]] = ..., logs_cancel: _Optional[_Union[LogsCancel, _Mapping]] = ..., remove_weights: _Optional[_Union[RemoveWeights, _Mapping]] = ..., cert_issued: _Optional[_Union[CertIssued, _Mapping]] = ..., provision: _Optional[_Union[Provision, _Mapping]] = ..., fabric_test: _Optional[_Union[FabricTestRequest, _Mapping]] = ..., controlplanes: _Optional[_Union[ControlPlanes, _Mapping]] = ..., upgrade_agent: _Optional[_Union[UpgradeAgent, _Mapping]] = ..., sleep_shard: _Optional[_Union[SleepShard, _Mapping]] = ..., tunnel_offer: _Optional[_Union[TunnelOffer, _Mapping]] = ...) -> None: ...

class TunnelOffer(_message.Message):
    __slots__ = ("port",)
    PORT_FIELD_NUMBER: _ClassVar[int]
    port: int
    def __init__(self, port: _Optional[int] = ...) -> None: ...

class SleepShard(_message.Message):
    __slots__ = ("shard_id", "level")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    level: int
    def __init__(self, shard_id: _Optional[str] = ..., level: _Optional[int] = ...) -> None: ...

class UpgradeAgent(_message.Message):
    __slots__ = ("id", "version", "index_url", "find_links")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    INDEX_URL_FIELD_NUMBER: _ClassVar[int]
    FIND_LINKS_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    index_url: str
    find_links: bool
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., index_url: _Optional[str] = ..., find_links: bool = ...) -> None: ...

class UpgradeStatus(_message.Message):
    __slots__ = ("id", "version", "state", "message", "last_output")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAST_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    id: str
    version: str
    state: UpgradeState
    message: str
    last_output: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., version: _Optional[str] = ..., state: _Optional[_Union[UpgradeState, str]] = ..., message: _Optional[str] = ..., last_output: _Optional[_Iterable[str]] = ...) -> None: ...

class ControlPlanes(_message.Message):
    __slots__ = ("addrs",)
    ADDRS_FIELD_NUMBER: _ClassVar[int]
    addrs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, addrs: _Optional[_Iterable[str]] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "hostname", "agent_version", "inventory", "shards", "mgmt_addr", "labels", "engines", "mgmt_interface", "host", "hcas", "fabrics", "model_dirs", "weights", "nvlink", "installs", "subnet_managers", "protocol", "engine_access")
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
    MGMT_INTERFACE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    HCAS_FIELD_NUMBER: _ClassVar[int]
    FABRICS_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIRS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_FIELD_NUMBER: _ClassVar[int]
    INSTALLS_FIELD_NUMBER: _ClassVar[int]
    SUBNET_MANAGERS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ACCESS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    hostname: str
    agent_version: str
    inventory: Inventory
    shards: _containers.RepeatedCompositeFieldContainer[ShardStatus]
    mgmt_addr: str
    labels: _containers.ScalarMap[str, str]
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    mgmt_interface: str
    host: HostFacts
    hcas: _containers.RepeatedCompositeFieldContainer[Hca]
    fabrics: _containers.RepeatedCompositeFieldContainer[Fabric]
    model_dirs: _containers.RepeatedCompositeFieldContainer[ModelDir]
    weights: _containers.RepeatedCompositeFieldContainer[WeightFile]
    nvlink: NvlinkFabric
    installs: _containers.RepeatedCompositeFieldContainer[EngineInstall]
    subnet_managers: _containers.RepeatedCompositeFieldContainer[SubnetManager]
    protocol: int
    engine_access: str
    def __init__(self, node_id: _Optional[str] = ..., hostname: _Optional[str] = ..., agent_version: _Optional[str] = ..., inventory: _Optional[_Union[Inventory, _Mapping]] = ..., shards: _Optional[_Iterable[_Union[ShardStatus, _Mapping]]] = ..., mgmt_addr: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ..., mgmt_interface: _Optional[str] = ..., host: _Optional[_Union[HostFacts, _Mapping]] = ..., hcas: _Optional[_Iterable[_Union[Hca, _Mapping]]] = ..., fabrics: _Optional[_Iterable[_Union[Fabric, _Mapping]]] = ..., model_dirs: _Optional[_Iterable[_Union[ModelDir, _Mapping]]] = ..., weights: _Optional[_Iterable[_Union[WeightFile, _Mapping]]] = ..., nvlink: _Optional[_Union[NvlinkFabric, _Mapping]] = ..., installs: _Optional[_Iterable[_Union[EngineInstall, _Mapping]]] = ..., subnet_managers: _Optional[_Iterable[_Union[SubnetManager, _Mapping]]] = ..., protocol: _Optional[int] = ..., engine_access: _Optional[str] = ...) -> None: ...

class HostFacts(_message.Message):
    __slots__ = ("os_id", "os_version", "os_codename", "arch", "kernel", "cpu_flags", "nvidia_driver")
    OS_ID_FIELD_NUMBER: _ClassVar[int]
    OS_VERSION_FIELD_NUMBER: _ClassVar[int]
    OS_CODENAME_FIELD_NUMBER: _ClassVar[int]
    ARCH_FIELD_NUMBER: _ClassVar[int]
    KERNEL_FIELD_NUMBER: _ClassVar[int]
    CPU_FLAGS_FIELD_NUMBER: _ClassVar[int]
    NVIDIA_DRIVER_FIELD_NUMBER: _ClassVar[int]
    os_id: str
    os_version: str
    os_codename: str
    arch: str
    kernel: str
    cpu_flags: _containers.RepeatedScalarFieldContainer[str]
    nvidia_driver: str
    def __init__(self, os_id: _Optional[str] = ..., os_version: _Optional[str] = ..., os_codename: _Optional[str] = ..., arch: _Optional[str] = ..., kernel: _Optional[str] = ..., cpu_flags: _Optional[_Iterable[str]] = ..., nvidia_driver: _Optional[str] = ...) -> None: ...

class HcaPort(_message.Message):
    __slots__ = ("port", "state", "phys_state", "rate_gbps", "link_layer", "port_guid", "gid_prefix", "roce_v2_gid_index", "counters", "netdev")
    class CountersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    PORT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PHYS_STATE_FIELD_NUMBER: _ClassVar[int]
    RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    LINK_LAYER_FIELD_NUMBER: _ClassVar[int]
    PORT_GUID_FIELD_NUMBER: _ClassVar[int]
    GID_PREFIX_FIELD_NUMBER: _ClassVar[int]
    ROCE_V2_GID_INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    NETDEV_FIELD_NUMBER: _ClassVar[int]
    port: int
    state: str
    phys_state: str
    rate_gbps: float
    link_layer: str
    port_guid: str
    gid_prefix: str
    roce_v2_gid_index: int
    counters: _containers.ScalarMap[str, int]
    netdev: str
    def __init__(self, port: _Optional[int] = ..., state: _Optional[str] = ..., phys_state: _Optional[str] = ..., rate_gbps: _Optional[float] = ..., link_layer: _Optional[str] = ..., port_guid: _Optional[str] = ..., gid_prefix: _Optional[str] = ..., roce_v2_gid_index: _Optional[int] = ..., counters: _Optional[_Mapping[str, int]] = ..., netdev: _Optional[str] = ...) -> None: ...

class Hca(_message.Message):
    __slots__ = ("name", "node_guid", "ports")
    NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_GUID_FIELD_NUMBER: _ClassVar[int]
    PORTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    node_guid: str
    ports: _containers.RepeatedCompositeFieldContainer[HcaPort]
    def __init__(self, name: _Optional[str] = ..., node_guid: _Optional[str] = ..., ports: _Optional[_Iterable[_Union[HcaPort, _Mapping]]] = ...) -> None: ...

class Fabric(_message.Message):
    __slots__ = ("name", "hcas")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HCAS_FIELD_NUMBER: _ClassVar[int]
    name: str
    hcas: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., hcas: _Optional[_Iterable[str]] = ...) -> None: ...

class SubnetManager(_message.Message):
    __slots__ = ("lid", "guid", "priority", "state", "via")
    LID_FIELD_NUMBER: _ClassVar[int]
    GUID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    VIA_FIELD_NUMBER: _ClassVar[int]
    lid: int
    guid: str
    priority: int
    state: str
    via: str
    def __init__(self, lid: _Optional[int] = ..., guid: _Optional[str] = ..., priority: _Optional[int] = ..., state: _Optional[str] = ..., via: _Optional[str] = ...) -> None: ...

class ModelDir(_message.Message):
    __slots__ = ("path", "total_bytes", "free_bytes", "shared", "fs_type")
    PATH_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    FS_TYPE_FIELD_NUMBER: _ClassVar[int]
    path: str
    total_bytes: int
    free_bytes: int
    shared: bool
    fs_type: str
    def __init__(self, path: _Optional[str] = ..., total_bytes: _Optional[int] = ..., free_bytes: _Optional[int] = ..., shared: bool = ..., fs_type: _Optional[str] = ...) -> None: ...

class WeightFile(_message.Message):
    __slots__ = ("path", "size_bytes", "format", "params", "layers", "heads", "kv_heads", "head_dim", "hidden_size", "context_length", "dtype_bytes", "fetched_by_llmgw", "source", "last_used_unix", "cache_name")
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEADS_FIELD_NUMBER: _ClassVar[int]
    KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    DTYPE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BY_LLMGW_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    LAST_USED_UNIX_FIELD_NUMBER: _ClassVar[int]
    CACHE_NAME_FIELD_NUMBER: _ClassVar[int]
    path: str
    size_bytes: int
    format: str
    params: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    hidden_size: int
    context_length: int
    dtype_bytes: int
    fetched_by_llmgw: bool
    source: str
    last_used_unix: int
    cache_name: str
    def __init__(self, path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., format: _Optional[str] = ..., params: _Optional[int] = ..., layers: _Optional[int] = ..., heads: _Optional[int] = ..., kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., hidden_size: _Optional[int] = ..., context_length: _Optional[int] = ..., dtype_bytes: _Optional[int] = ..., fetched_by_llmgw: bool = ..., source: _Optional[str] = ..., last_used_unix: _Optional[int] = ..., cache_name: _Optional[str] = ...) -> None: ...

class NvlinkFabric(_message.Message):
    __slots__ = ("state", "clique_id", "cluster_uuid", "imex_state")
    STATE_FIELD_NUMBER: _ClassVar[int]
    CLIQUE_ID_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_UUID_FIELD_NUMBER: _ClassVar[int]
    IMEX_STATE_FIELD_NUMBER: _ClassVar[int]
    state: str
    clique_id: str
    cluster_uuid: str
    imex_state: str
    def __init__(self, state: _Optional[str] = ..., clique_id: _Optional[str] = ..., cluster_uuid: _Optional[str] = ..., imex_state: _Optional[str] = ...) -> None: ...

class ShardLoad(_message.Message):
    __slots__ = ("shard_id", "cpu_cores", "rss_bytes")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    RSS_BYTES_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    cpu_cores: float
    rss_bytes: int
    def __init__(self, shard_id: _Optional[str] = ..., cpu_cores: _Optional[float] = ..., rss_bytes: _Optional[int] = ...) -> None: ...

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
    __slots__ = ("index", "uuid", "name", "memory_total_bytes", "memory_used_bytes", "compute_capability", "nvlink_peers", "pci_bus_id", "processes", "utilization_percent", "utilization_known")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    NVLINK_PEERS_FIELD_NUMBER: _ClassVar[int]
    PCI_BUS_ID_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_KNOWN_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    compute_capability: str
    nvlink_peers: _containers.RepeatedScalarFieldContainer[int]
    pci_bus_id: str
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    utilization_percent: int
    utilization_known: bool
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., compute_capability: _Optional[str] = ..., nvlink_peers: _Optional[_Iterable[int]] = ..., pci_bus_id: _Optional[str] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., utilization_percent: _Optional[int] = ..., utilization_known: bool = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory_bytes", "name")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory_bytes: int
    name: str
    def __init__(self, pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ..., name: _Optional[str] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("memory_total_bytes", "memory_available_bytes", "cpu_percent", "load1", "gpus", "disks", "load5", "load15", "shard_load", "hcas", "weights_changed", "weights", "fabrics_changed", "fabrics", "engines_changed", "engines", "model_dirs_changed", "model_dirs", "nvlink", "subnet_managers_changed", "subnet_managers", "installs_changed", "installs")
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_AVAILABLE_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    DISKS_FIELD_NUMBER: _ClassVar[int]
    LOAD5_FIELD_NUMBER: _ClassVar[int]
    LOAD15_FIELD_NUMBER: _ClassVar[int]
    SHARD_LOAD_FIELD_NUMBER: _ClassVar[int]
    HCAS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FABRICS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    FABRICS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIRS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    MODEL_DIRS_FIELD_NUMBER: _ClassVar[int]
    NVLINK_FIELD_NUMBER: _ClassVar[int]
    SUBNET_MANAGERS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    SUBNET_MANAGERS_FIELD_NUMBER: _ClassVar[int]
    INSTALLS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    INSTALLS_FIELD_NUMBER: _ClassVar[int]
    memory_total_bytes: int
    memory_available_bytes: int
    cpu_percent: float
    load1: float
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    disks: _containers.RepeatedCompositeFieldContainer[Disk]
    load5: float
    load15: float
    shard_load: _containers.RepeatedCompositeFieldContainer[ShardLoad]
    hcas: _containers.RepeatedCompositeFieldContainer[Hca]
    weights_changed: bool
    weights: _containers.RepeatedCompositeFieldContainer[WeightFile]
    fabrics_changed: bool
    fabrics: _containers.RepeatedCompositeFieldContainer[Fabric]
    engines_changed: bool
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    model_dirs_changed: bool
    model_dirs: _containers.RepeatedCompositeFieldContainer[ModelDir]
    nvlink: NvlinkFabric
    subnet_managers_changed: bool
    subnet_managers: _containers.RepeatedCompositeFieldContainer[SubnetManager]
    installs_changed: bool
    installs: _containers.RepeatedCompositeFieldContainer[EngineInstall]
    def __init__(self, memory_total_bytes: _Optional[int] = ..., memory_available_bytes: _Optional[int] = ..., cpu_percent: _Optional[float] = ..., load1: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., disks: _Optional[_Iterable[_Union[Disk, _Mapping]]] = ..., load5: _Optional[float] = ..., load15: _Optional[float] = ..., shard_load: _Optional[_Iterable[_Union[ShardLoad, _Mapping]]] = ..., hcas: _Optional[_Iterable[_Union[Hca, _Mapping]]] = ..., weights_changed: bool = ..., weights: _Optional[_Iterable[_Union[WeightFile, _Mapping]]] = ..., fabrics_changed: bool = ..., fabrics: _Optional[_Iterable[_Union[Fabric, _Mapping]]] = ..., engines_changed: bool = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ..., model_dirs_changed: bool = ..., model_dirs: _Optional[_Iterable[_Union[ModelDir, _Mapping]]] = ..., nvlink: _Optional[_Union[NvlinkFabric, _Mapping]] = ..., subnet_managers_changed: bool = ..., subnet_managers: _Optional[_Iterable[_Union[SubnetManager, _Mapping]]] = ..., installs_changed: bool = ..., installs: _Optional[_Iterable[_Union[EngineInstall, _Mapping]]] = ...) -> None: ...

class ShardSpec(_message.Message):
    __slots__ = ("shard_id", "replica_id", "model", "engine", "served_name", "source", "args", "port", "api_key", "threads", "memory_bytes", "startup_timeout_s", "env", "gpus", "nnodes", "rank", "leader_addr", "leader_port", "hcas", "tensor_parallel", "pipeline_parallel", "dtype", "context_length", "gpu_memory_bytes", "source_sha256", "source_file", "hub_endpoint", "hub_token", "mirror_url", "engine_version", "adapters", "sleep_mode", "kv_events")
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
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NNODES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDR_FIELD_NUMBER: _ClassVar[int]
    LEADER_PORT_FIELD_NUMBER: _ClassVar[int]
    HCAS_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PIPELINE_PARALLEL_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_LENGTH_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_SHA256_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FILE_FIELD_NUMBER: _ClassVar[int]
    HUB_ENDPOINT_FIELD_NUMBER: _ClassVar[int]
    HUB_TOKEN_FIELD_NUMBER: _ClassVar[int]
    MIRROR_URL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    SLEEP_MODE_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
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
    gpus: _containers.RepeatedScalarFieldContainer[int]
    nnodes: int
    rank: int
    leader_addr: str
    leader_port: int
    hcas: _containers.RepeatedScalarFieldContainer[str]
    tensor_parallel: int
    pipeline_parallel: int
    dtype: str
    context_length: int
    gpu_memory_bytes: int
    source_sha256: str
    source_file: str
    hub_endpoint: str
    hub_token: str
    mirror_url: str
    engine_version: str
    adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    sleep_mode: bool
    kv_events: bool
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., served_name: _Optional[str] = ..., source: _Optional[str] = ..., args: _Optional[_Iterable[str]] = ..., port: _Optional[int] = ..., api_key: _Optional[str] = ..., threads: _Optional[int] = ..., memory_bytes: _Optional[int] = ..., startup_timeout_s: _Optional[int] = ..., env: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[_Iterable[int]] = ..., nnodes: _Optional[int] = ..., rank: _Optional[int] = ..., leader_addr: _Optional[str] = ..., leader_port: _Optional[int] = ..., hcas: _Optional[_Iterable[str]] = ..., tensor_parallel: _Optional[int] = ..., pipeline_parallel: _Optional[int] = ..., dtype: _Optional[str] = ..., context_length: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., source_sha256: _Optional[str] = ..., source_file: _Optional[str] = ..., hub_endpoint: _Optional[str] = ..., hub_token: _Optional[str] = ..., mirror_url: _Optional[str] = ..., engine_version: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ..., sleep_mode: bool = ..., kv_events: bool = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class StartShard(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: ShardSpec
    def __init__(self, spec: _Optional[_Union[ShardSpec, _Mapping]] = ...) -> None: ...

class Drain(_message.Message):
    __slots__ = ("shard_id", "timeout_s")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    timeout_s: int
    def __init__(self, shard_id: _Optional[str] = ..., timeout_s: _Optional[int] = ...) -> None: ...

class LogsRequest(_message.Message):
    __slots__ = ("request_id", "shard_id", "lines", "follow")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    shard_id: str
    lines: int
    follow: bool
    def __init__(self, request_id: _Optional[str] = ..., shard_id: _Optional[str] = ..., lines: _Optional[int] = ..., follow: bool = ...) -> None: ...

class LogsCancel(_message.Message):
    __slots__ = ("request_id",)
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    def __init__(self, request_id: _Optional[str] = ...) -> None: ...

class LogsReply(_message.Message):
    __slots__ = ("request_id", "lines", "error", "done")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    error: str
    done: bool
    def __init__(self, request_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., error: _Optional[str] = ..., done: bool = ...) -> None: ...

class StopShard(_message.Message):
    __slots__ = ("shard_id", "grace_s", "reason")
    SHARD_ID_FIELD_NUMBER: _ClassVar[int]
    GRACE_S_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    shard_id: str
    grace_s: int
    reason: str
    def __init__(self, shard_id: _Optional[str] = ..., grace_s: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class FetchProgress(_message.Message):
    __slots__ = ("done_bytes", "total_bytes", "rate_bps", "eta_s", "state", "message")
    DONE_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    RATE_BPS_FIELD_NUMBER: _ClassVar[int]
    ETA_S_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    done_bytes: int
    total_bytes: int
    rate_bps: float
    eta_s: float
    state: str
    message: str
    def __init__(self, done_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., rate_bps: _Optional[float] = ..., eta_s: _Optional[float] = ..., state: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class RemoveWeights(_message.Message):
    __slots__ = ("cache_name",)
    CACHE_NAME_FIELD_NUMBER: _ClassVar[int]
    cache_name: str
    def __init__(self, cache_name: _Optional[str] = ...) -> None: ...

class ShardStatus(_message.Message):
    __slots__ = ("shard_id", "replica_id", "state", "message", "exited", "exit_code", "last_output", "endpoint", "pid", "spec", "adopted", "probe_failures", "fetch", "adapters", "adapters_message", "sleep_level")
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
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    PROBE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    FETCH_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    SLEEP_LEVEL_FIELD_NUMBER: _ClassVar[int]
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
    adopted: bool
    probe_failures: int
    fetch: FetchProgress
    adapters: _containers.RepeatedScalarFieldContainer[str]
    adapters_message: str
    sleep_level: int
    def __init__(self, shard_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., state: _Optional[_Union[ShardState, str]] = ..., message: _Optional[str] = ..., exited: bool = ..., exit_code: _Optional[int] = ..., last_output: _Optional[_Iterable[str]] = ..., endpoint: _Optional[str] = ..., pid: _Optional[int] = ..., spec: _Optional[_Union[ShardSpec, _Mapping]] = ..., adopted: bool = ..., probe_failures: _Optional[int] = ..., fetch: _Optional[_Union[FetchProgress, _Mapping]] = ..., adapters: _Optional[_Iterable[str]] = ..., adapters_message: _Optional[str] = ..., sleep_level: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("seq", "ok", "error", "leader", "term", "controlplanes", "rejoin", "protocol", "server_version")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    CONTROLPLANES_FIELD_NUMBER: _ClassVar[int]
    REJOIN_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    seq: int
    ok: bool
    error: str
    leader: str
    term: int
    controlplanes: _containers.RepeatedScalarFieldContainer[str]
    rejoin: bool
    protocol: int
    server_version: str
    def __init__(self, seq: _Optional[int] = ..., ok: bool = ..., error: _Optional[str] = ..., leader: _Optional[str] = ..., term: _Optional[int] = ..., controlplanes: _Optional[_Iterable[str]] = ..., rejoin: bool = ..., protocol: _Optional[int] = ..., server_version: _Optional[str] = ...) -> None: ...

class EngineWant(_message.Message):
    __slots__ = ("engine", "version")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    engine: str
    version: str
    def __init__(self, engine: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class Provision(_message.Message):
    __slots__ = ("wants", "index_url", "find_links", "remove", "os_packages")
    WANTS_FIELD_NUMBER: _ClassVar[int]
    INDEX_URL_FIELD_NUMBER: _ClassVar[int]
    FIND_LINKS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    OS_PACKAGES_FIELD_NUMBER: _ClassVar[int]
    wants: _containers.RepeatedCompositeFieldContainer[EngineWant]
    index_url: str
    find_links: bool
    remove: _containers.RepeatedCompositeFieldContainer[EngineWant]
    os_packages: bool
    def __init__(self, wants: _Optional[_Iterable[_Union[EngineWant, _Mapping]]] = ..., index_url: _Optional[str] = ..., find_links: bool = ..., remove: _Optional[_Iterable[_Union[EngineWant, _Mapping]]] = ..., os_packages: bool = ...) -> None: ...

class EngineInstall(_message.Message):
    __slots__ = ("engine", "version", "variant", "state", "message", "bytes_done", "bytes_total", "last_output", "path", "checked_unix", "retry_unix", "missing_os_packages", "os_install_command")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    VARIANT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    BYTES_DONE_FIELD_NUMBER: _ClassVar[int]
    BYTES_TOTAL_FIELD_NUMBER: _ClassVar[int]
    LAST_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    CHECKED_UNIX_FIELD_NUMBER: _ClassVar[int]
    RETRY_UNIX_FIELD_NUMBER: _ClassVar[int]
    MISSING_OS_PACKAGES_FIELD_NUMBER: _ClassVar[int]
    OS_INSTALL_COMMAND_FIELD_NUMBER: _ClassVar[int]
    engine: str
    version: str
    variant: str
    state: InstallState
    message: str
    bytes_done: int
    bytes_total: int
    last_output: _containers.RepeatedScalarFieldContainer[str]
    path: str
    checked_unix: float
    retry_unix: float
    missing_os_packages: _containers.RepeatedScalarFieldContainer[str]
    os_install_command: str
    def __init__(self, engine: _Optional[str] = ..., version: _Optional[str] = ..., variant: _Optional[str] = ..., state: _Optional[_Union[InstallState, str]] = ..., message: _Optional[str] = ..., bytes_done: _Optional[int] = ..., bytes_total: _Optional[int] = ..., last_output: _Optional[_Iterable[str]] = ..., path: _Optional[str] = ..., checked_unix: _Optional[float] = ..., retry_unix: _Optional[float] = ..., missing_os_packages: _Optional[_Iterable[str]] = ..., os_install_command: _Optional[str] = ...) -> None: ...

class FabricTestRequest(_message.Message):
    __slots__ = ("test_id", "role", "hca", "hca_port", "tcp_port", "peer_addr", "size_bytes", "duration_s", "gid_index")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    HCA_FIELD_NUMBER: _ClassVar[int]
    HCA_PORT_FIELD_NUMBER: _ClassVar[int]
    TCP_PORT_FIELD_NUMBER: _ClassVar[int]
    PEER_ADDR_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    GID_INDEX_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    role: str
    hca: str
    hca_port: int
    tcp_port: int
    peer_addr: str
    size_bytes: int
    duration_s: int
    gid_index: int
    def __init__(self, test_id: _Optional[str] = ..., role: _Optional[str] = ..., hca: _Optional[str] = ..., hca_port: _Optional[int] = ..., tcp_port: _Optional[int] = ..., peer_addr: _Optional[str] = ..., size_bytes: _Optional[int] = ..., duration_s: _Optional[int] = ..., gid_index: _Optional[int] = ...) -> None: ...

class FabricTestResult(_message.Message):
    __slots__ = ("test_id", "role", "ok", "error", "gbps", "port_rate_gbps", "output")
    TEST_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    GBPS_FIELD_NUMBER: _ClassVar[int]
    PORT_RATE_GBPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    test_id: str
    role: str
    ok: bool
    error: str
    gbps: float
    port_rate_gbps: float
    output: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, test_id: _Optional[str] = ..., role: _Optional[str] = ..., ok: bool = ..., error: _Optional[str] = ..., gbps: _Optional[float] = ..., port_rate_gbps: _Optional[float] = ..., output: _Optional[_Iterable[str]] = ...) -> None: ...
