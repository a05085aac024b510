"""What a node is told to start: a replica's (or one rank's) ``ShardSpec``, and where its weights come from."""

from __future__ import annotations

import dataclasses

from llmgw.control.state import Member, ReplicaRecord
from llmgw.core import adapters, idle, specs
from llmgw.core.shards import ShardSpec
from llmgw.core.specs import ModelSpec

#: Where hf:// sources come from when the control plane is told nothing else.
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


@dataclasses.dataclass(frozen=True, slots=True)
class Hub:
    """Where a node fetches remote weights from, as the control plane's settings say."""

    #: The HF-compatible endpoint of hf:// sources: the hub itself, or the cluster's mirror.
    endpoint: str = DEFAULT_HUB_ENDPOINT
    #: The cluster mirror's base URL, for mirror:// sources ("": none).
    mirror_url: str = ""
    #: The hub's bearer token; a secret: kept out of reprs, sent only in an hf:// shard's StartShard.
    token: str = dataclasses.field(default="", repr=False)


def remote_fields(source: str, spec: ModelSpec, hub: Hub) -> dict[str, str]:
    """The ShardSpec fields a node needs to fetch ``source``: none for a local one (a file, a package).

    The token goes to an hf:// shard alone: an http(s) or mirror source, or a
    local one, has no use for it, and every copy is one more place it can leak from.
    """
    if source.startswith("hf://"):
        return {"hub_endpoint": hub.endpoint, "hub_token": hub.token, "source_file": spec.source_file}
    if source.startswith("mirror://"):
        return {"mirror_url": hub.mirror_url, "source_sha256": spec.source_sha256}
    if source.startswith(("http://", "https://")):
        return {"source_sha256": spec.source_sha256}
    return {}


def adapter_fields(spec: ModelSpec, hub: Hub) -> dict[str, str]:
    """The hub's endpoint and token, or the mirror's URL, when an adapter is fetched from one (as for weights)."""
    out: dict[str, str] = {}
    for a in spec.adapters:
        if a.source.startswith("hf://"):
            out |= {"hub_endpoint": hub.endpoint, "hub_token": hub.token}
        elif a.source.startswith("mirror://"):
            out["mirror_url"] = hub.mirror_url
    return out


def shard_spec(r: ReplicaRecord, spec: ModelSpec, *, hub: Hub = Hub()) -> ShardSpec:
    assert r.shard_id is not None
    tp, pp = specs.parallelism(spec.resources)
    # LoRA's limits (--enable-lora, --max-lora-rank...) and runtime loading, from spec.adapters: the
    # adapters themselves are loaded into the running engine, not named on its command line.
    lora_args, lora_env = adapters.launch_args(spec.engine, spec.adapters)
    return ShardSpec(
        shard_id=r.shard_id, replica_id=r.id, model=r.model, engine=spec.engine,
        served_name=spec.served_name, source=spec.source, args=spec.engine_args + lora_args, api_key=r.api_key,
        threads=spec.resources.cpu_threads, memory_bytes=spec.resources.memory_bytes,
        startup_timeout_s=int(spec.startup_timeout_s), env=tuple(sorted(spec.env + lora_env)), gpus=r.gpus,
        tensor_parallel=tp, pipeline_parallel=pp, dtype=spec.dtype, context_length=spec.context_length,
        gpu_memory_bytes=r.memory_bytes if spec.resources.gpus.count else 0, engine_version=spec.engine_version,
        sleep_mode=spec.idle is not None and spec.idle.action == "sleep" and idle.can_sleep(spec.engine, r.gpus),
        adapters=spec.adapters, kv_events=spec.routing == "kv_aware",
        **(adapter_fields(spec, hub) | remote_fields(spec.source, spec, hub)),
    )


def member_spec(r: ReplicaRecord, spec: ModelSpec, m: Member, *, hub: Hub = Hub()) -> ShardSpec:
    """The shard of one rank of a group: its GPUs and adapters, and the leader every rank meets at."""
    return dataclasses.replace(shard_spec(r, spec, hub=hub), shard_id=m.shard_id, gpus=m.gpus, nnodes=len(r.members),
                               rank=m.rank, leader_addr=r.leader_addr, leader_port=r.leader_port, hcas=m.hcas)
