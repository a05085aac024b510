"""The REST API's response bodies as pydantic models, so ``/api/openapi.json`` says what each call returns.

Each model mirrors the document its handler builds, field for field: a handler still builds a dict, and
FastAPI checks it against its ``response_model`` on the way out. A key that some bodies carry and others
leave out is declared with a default and the route answers with ``response_model_exclude_unset``, so a
body is what it was before these models. What the user wrote (a model's spec) or another module defines
(the router's table, an inventory's parts) is typed ``dict[str, Any]``. ``Number`` is a value that may be
a whole number or not (pydantic would write a ``float`` field's 2 as 2.0).
"""

from __future__ import annotations

from typing import Any, Literal

import pydantic

Number = int | float


class Body(pydantic.BaseModel):
    """A response body; its unknown keys are kept (a model that missed one must not change the body)."""

    model_config = pydantic.ConfigDict(extra="allow")


class Deleted(Body):
    deleted: str


class Applied(Body):
    """What a router's report changed: the events (or models) it applied."""

    applied: int


class Health(Body):
    status: str


class WhoAmI(Body):
    name: str
    role: str
    kind: str


class ControlPlane(Body):
    id: str
    role: str
    term: int
    lease_age_s: Number
    http_url: str
    agent_addr: str
    version: str
    last_seen_s: Number


class ControlPlanes(Body):
    controlplanes: list[ControlPlane]
    self_: str = pydantic.Field(alias="self")


class RouterVersion(Body):
    id: str
    version: str = pydantic.Field(description="The router's llmgw version (\"\": a router before 0.2.0)")
    protocol: int = pydantic.Field(description="Its wire protocol (0: a router before 0.2.0, protocol 1)")
    last_report_s: Number


class RouterVersions(Body):
    """The routers that sent a load report lately (every 2 s while they run), each with its version."""

    routers: list[RouterVersion]


class ModelStatus(Body):
    state: str
    message: str
    ready_replicas: int
    replicas: int
    generation: int = 0
    updated_replicas: int = 0
    autoscale: dict[str, Any] = pydantic.Field(default_factory=dict, description="Only for an autoscaled model")


class ModelDoc(Body):
    """A model's manifest and its status."""

    apiVersion: str  # noqa: N815 (the manifest's own key)
    kind: str
    metadata: dict[str, Any]
    spec: dict[str, Any]
    status: ModelStatus


class ModelList(Body):
    items: list[ModelDoc]


class Ejection(Body):
    router: str
    reason: str
    failures: int
    for_s: Number
    at: Number


class Replica(Body):
    id: str
    model: str = ""
    phase: str
    node: str | None
    shard: str | None
    gpus: list[int] = pydantic.Field(default_factory=list, description="Only in a describe")
    endpoint: str
    attempt: int
    failures: int
    message: str
    last_output: list[str]
    fingerprint: str = pydantic.Field(default="", description="Only in a describe")
    current: bool = pydantic.Field(default=False, description="Only in a describe")
    age_s: Number
    conditions: list[dict[str, Any]] = pydantic.Field(default_factory=list, description="Only in a describe")
    fetch: dict[str, Any] | None
    adapters: list[str] = pydantic.Field(default_factory=list, description="The LoRA adapters its engine holds now, "
                                                                           "as its node last reported")
    router_ejections: list[Ejection] = pydantic.Field(default_factory=list, description="Only in a list")
    sleep_level: int = pydantic.Field(default=0, description="spec.idle: the level its engine sleeps at (a Ready "
                                      "replica shown Sleeping); 0: awake")


class ReplicaList(Body):
    items: list[Replica]


class Event(Body):
    time: Number
    kind: str
    reason: str
    object: str
    message: str
    model: str
    node: str
    id: int


class EventList(Body):
    items: list[Event]


class ModelDescribe(Body):
    name: str
    spec: dict[str, Any]
    fingerprint: str
    generation: int
    created_at: Number
    updated_at: Number
    status: ModelStatus
    conditions: list[dict[str, Any]]
    replicas: list[Replica]
    events: list[Event]
    autoscale: dict[str, Any] = pydantic.Field(default_factory=dict, description="Only for an autoscaled model")


class Gpu(Body):
    index: int
    name: str
    memory_total_bytes: int
    memory_used_bytes: int
    utilization_percent: int | None = pydantic.Field(
        None, description="How busy the GPU was (0..100) at the node's last heartbeat; null where its agent does "
                          "not report it (an older agent, or a driver that cannot measure it)")
    nvlink_peers: list[int] = pydantic.Field(default_factory=list, description="Only in a list")


class EngineVersion(Body):
    name: str
    version: str


class Scheduling(Body):
    id: str
    cordoned: bool
    draining: bool
    status: str


class NodeUpgrade(Body):
    """The node's last agent upgrade (``llmgw node upgrade``), as the leader knows it."""

    id: str
    version: str
    from_version: str
    state: str
    message: str
    summary: str


class EngineAccessDoc(Body):
    mode: str = pydantic.Field(description="How routers reach the node's engines: direct (at its address) or tunnel "
                               "(through the connection its agent dials out; issue 33)")
    reason: str = pydantic.Field(description="Why: the agent's engine_access, auto's check, the tunnel's state")


class Node(Scheduling):
    hostname: str
    mgmt_addr: str
    engine_access: EngineAccessDoc | None = None
    agent_version: str
    version_skew: bool = pydantic.Field(description="The agent runs another llmgw version than this control plane "
                                        "(an upgrade under way, or one forgotten)")
    upgrade: NodeUpgrade | None = None
    connected: bool
    last_seen: Number
    #: The agent's ``labels`` (``llmgw get nodes -l pool=gpu`` selects on them).
    labels: dict[str, str]
    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    gpus: list[Gpu]
    engines: list[EngineVersion]
    shards: int
    shard_states: list[dict[str, Any]]
    mgmt_interface: str
    host: dict[str, Any]
    hcas: list[dict[str, Any]]
    fabrics: list[dict[str, Any]]
    model_dirs: list[dict[str, Any]]
    weights: list[dict[str, Any]]
    nvlink: dict[str, Any]
    subnet_managers: list[dict[str, Any]]
    load: dict[str, dict[str, Number]]


class NodeList(Body):
    items: list[Node]
    total: int


class NodeDescribe(Scheduling):
    hostname: str
    mgmt_addr: str
    engine_access: EngineAccessDoc | None = None
    agent_version: str
    version_skew: bool = pydantic.Field(description="The agent runs another llmgw version than this control plane "
                                        "(an upgrade under way, or one forgotten)")
    upgrade: NodeUpgrade | None = None
    connected: bool
    last_seen: Number
    labels: dict[str, str]
    cpu_count: int
    memory_total_bytes: int
    memory_available_bytes: int
    gpus: list[Gpu]
    engines: list[EngineVersion]
    installs: list[dict[str, Any]]
    replicas: list[Replica]
    shards: list[dict[str, Any]]
    events: list[Event]


class RouterTable(Body):
    """The routers' table (``GET /api/v1/endpoints``): the wire document the router reads, with its version.

    Each model's entry and the keys are the wire's own (``Cluster.endpoints_doc``), typed there.
    """

    version: int
    models: list[dict[str, Any]]
    auth: dict[str, Any] = pydantic.Field(default_factory=dict, description="Absent from the empty first table")
    engine_ca: str = pydantic.Field("", description="The cluster CA's certificate (PEM) that routers verify "
                                    "https:// engines with; absent without one (an --insecure server)")


class RouterKv(Body):
    """The replicas' sampled KV block sets (``GET /api/v1/router/kv``, ``llmgw.api.kvdocs.KvDoc``): each change a
    replica's ``added``/``removed`` keys (base64 of 8-byte big-endian), ``full`` (its whole set) or ``gone``."""

    version: int
    origin: str = pydantic.Field(description="names the relay (one leader's run) the versions count in")
    reset: bool = pydantic.Field(description="true: every set whole, replacing what the router held")
    changes: list[dict[str, Any]]


#: The windows ``GET /api/v1/metrics/history`` reads (``control.history.WINDOWS``).
HistoryWindow = Literal["5m", "15m", "1h", "6h", "24h"]


class HistoryLine(Body):
    name: str
    unit: str
    values: list[float | None] = pydantic.Field(description="one per bucket of ``times``; null: nothing heard then")


class HistoryChart(Body):
    title: str
    unit: str = pydantic.Field(description="'/s' a rate, ' ms', '%', 'B' bytes, '' a count")
    lines: list[HistoryLine]


class HistoryDoc(Body):
    scope: Literal["model", "node"]
    name: str
    window: HistoryWindow
    step_s: int = pydantic.Field(description="each bucket's width: 10 s up to 1 h, 60 s beyond")
    recorded: bool = pydantic.Field(description="false: nothing recorded for it on the leader yet (no charts)")
    times: list[int] = pydantic.Field(description="each bucket's start, Unix seconds, oldest first")
    charts: list[HistoryChart]
