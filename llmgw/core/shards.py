"""Shards: one engine process on one node, the unit the agent supervises.

A replica of a model is served by one shard, or, when it spans nodes, by one
shard per rank, all started and failed together. The control plane names
shards and the agent never invents one, so a shard id seen twice is the same
process.
"""

from __future__ import annotations

import dataclasses
import enum
import re

from llmgw.core import envpolicy, errors
from llmgw.core.adapters import Adapter


class ShardState(enum.Enum):
    """Where a shard stands, as its agent last reported it."""

    #: The process was launched and is loading; it does not answer yet.
    STARTING = "Starting"
    #: The engine answers /health and lists its served model: traffic may go to it.
    READY = "Ready"
    #: The process exited, or could not be launched; the message says why.
    FAILED = "Failed"
    #: A stop was asked for and the process has not exited yet.
    STOPPING = "Stopping"
    #: The process is gone because it was asked to stop.
    STOPPED = "Stopped"
    #: A drain was asked: no new requests reach it; in-flight ones are finishing.
    DRAINING = "Draining"
    #: Drained: nothing in flight, so stopping it now fails no request.
    DRAINED = "Drained"
    #: The process lives but stopped answering its health probe (a deadlock, a wedged GPU,
    #: ``kill -STOP``): no traffic goes to it; it becomes READY again if a probe passes, and the
    #: control plane replaces it once it has stayed so past a grace period.
    UNHEALTHY = "Unhealthy"
    #: Its weights are being fetched (``ShardStatus.fetch`` says how far); no process yet.
    FETCHING = "Fetching"

    @classmethod
    def terminal(cls) -> frozenset[ShardState]:
        """States from which a shard never moves again."""
        return frozenset({cls.FAILED, cls.STOPPED})

    @classmethod
    def live(cls) -> frozenset[ShardState]:
        """States in which a process may still exist."""
        return frozenset({cls.STARTING, cls.READY, cls.STOPPING, cls.DRAINING, cls.DRAINED, cls.UNHEALTHY,
                          cls.FETCHING})


@dataclasses.dataclass(frozen=True, slots=True)
class ShardSpec:
    """Everything needed to run one engine process; mirrors ``llmgw.v1.ShardSpec``."""

    shard_id: str
    replica_id: str
    model: str
    engine: str
    served_name: str
    source: str = ""
    args: tuple[str, ...] = ()
    port: int = 0
    api_key: str = ""
    threads: int = 0
    memory_bytes: int = 0
    startup_timeout_s: int = 600
    env: tuple[tuple[str, str], ...] = ()
    #: The node's GPU indices (as NVML and nvidia-smi number them) the engine may use, in order;
    #: empty for an engine that gets none. The agent sets CUDA_VISIBLE_DEVICES from it.
    gpus: tuple[int, ...] = ()
    #: Ranks of its replica; more than 1 for a replica that spans nodes (one shard per rank).
    nnodes: int = 1
    #: This shard's rank; rank 0 leads and is the one that serves the API.
    rank: int = 0
    #: The leader's management address and rendezvous port, the same in every rank of one replica.
    leader_addr: str = ""
    leader_port: int = 0
    #: The fabric adapters this rank uses (NCCL_IB_HCA); empty for a one-node replica.
    hcas: tuple[str, ...] = ()
    #: Tensor and pipeline parallel sizes of the whole replica, over all its ranks
    #: (``specs.parallelism``); their product is the replica's GPUs, 1 each without GPUs.
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    #: The dtype the engine runs the weights in ("bfloat16", "fp8", ...); "": the engine's choice.
    dtype: str = ""
    #: Tokens of context to serve; 0: the engine's default (or its context flag in ``args``).
    context_length: int = 0
    #: Memory placement gave the replica on each of its GPUs; 0: not stated nor estimated.
    gpu_memory_bytes: int = 0
    #: Remote weights: the expected sha256 of an http(s)/mirror file ("" unknown), the one file of
    #: an hf repo (a .gguf), the HF-compatible endpoint, its token (secret: never logged, never in
    #: the REST API) and the cluster mirror's base URL.
    source_sha256: str = ""
    source_file: str = ""
    hub_endpoint: str = ""
    hub_token: str = dataclasses.field(default="", repr=False)
    mirror_url: str = ""
    #: The model's ``engine_version`` ("" any): which of a node's installs of the engine runs it.
    engine_version: str = ""
    #: LoRA adapters the agent loads into the engine once ready (``core.adapters``); changing them alone
    #: (a StartShard for the live shard) loads and unloads at runtime, never restarts it.
    adapters: tuple[Adapter, ...] = ()
    #: Start the engine with its sleep mode on (spec.idle.action sleep, an engine that has one: issue 31).
    sleep_mode: bool = False
    #: Start the engine publishing its KV cache events to the agent (routing kv_aware; ``agent/kvlink.py``).
    kv_events: bool = False


#: Variables llmgw sets itself in every engine's environment: a spec's env may not set them
#: (``llmgw.core.envpolicy`` says why each).
RESERVED_ENV = envpolicy.RESERVED


def env_refusal(key: str) -> str | None:
    """Why no model's env may set ``key``, whatever the cluster's settings; None when it may.

    The agent drops such a variable at launch (a model stored before the rule, or sent by an older
    control plane); the engine allowlist and the admin's ``allowed_env`` are the control plane's, at apply.
    """
    return envpolicy.hard_refusal(key)


@dataclasses.dataclass(frozen=True, slots=True)
class FetchProgress:
    """A weights fetch as it goes; mirrors ``llmgw.v1.FetchProgress``."""

    done_bytes: int = 0
    #: 0: not known yet.
    total_bytes: int = 0
    rate_bps: float = 0.0
    #: -1: unknown.
    eta_s: float = -1.0
    #: "fetching", "stalled", "verifying", "done" or "failed".
    state: str = "fetching"
    #: Why, for stalled and failed.
    message: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardStatus:
    """A shard as its agent reports it."""

    shard_id: str
    replica_id: str
    state: ShardState
    message: str = ""
    exit_code: int | None = None
    last_output: tuple[str, ...] = ()
    endpoint: str = ""
    pid: int = 0
    spec: ShardSpec | None = None
    #: True for an engine a previous agent left running, while it is being checked.
    adopted: bool = False
    #: Health probes failed in a row since the last one that passed (READY/UNHEALTHY only).
    #: Routers stop sending new requests to the shard from the first failure.
    probe_failures: int = 0
    #: How far its weights fetch is (FETCHING only).
    fetch: FetchProgress | None = None
    #: The LoRA adapters loaded into its engine now, by name; and why the last load or unload failed.
    adapters: tuple[str, ...] = ()
    adapters_message: str = ""
    #: The engine sleeps at this level (spec.idle); 0: awake. Only a READY shard sleeps.
    sleep_level: int = 0


#: The longest shard id accepted. The control plane names a shard
#: ``<replica id>-<attempt>`` (``-<rank>`` added for a replica that spans nodes),
#: and a replica id is ``<model name>-<6 hex digits>``, a model name at most 63
#: characters: an id nearer 80. Bounded, because the id becomes a file name
#: (255 bytes at most) with a suffix.
SHARD_ID_MAX = 128
# Exactly the shape the control plane generates: model names are lower-case
# letters, digits, '.' and '-', starting with a letter or digit (specs.NAME_RE),
# and the rest is digits, hex and '-'.
_SHARD_ID = re.compile(r"[a-z0-9][a-z0-9.-]*")
_EXAMPLE = "'llama-3.1-8b-1a2b3c-2'"


def check_shard_id(shard_id: str) -> str:
    """``shard_id`` itself when it is a usable shard id; ShardIdError saying why otherwise.

    Called wherever a shard id becomes a path (the launch's log, state files,
    a log request) and where a request carries one in. Measured before this
    existed: ``GET /api/v1/nodes/N/logs?shard=/var/log/dpkg`` returned that
    node's /var/log/dpkg.log, because the agent read ``<run_dir>/<id>.log``
    for whatever id it was sent. With no '/', no NUL and no leading '.', an id
    is one file name inside the run directory and can name nothing else; a
    '..' inside one (a model named "a..b") then names no parent and is allowed.
    """
    problem = _problem(shard_id)
    if problem is None:
        return shard_id
    shown = repr(shard_id) if len(shard_id) <= 80 else f"{shard_id[:40]!r}... ({len(shard_id)} characters)"
    raise errors.ShardIdError(
        f"shard id {shown} is not valid: {problem}. A shard id is the name the control plane "
        f"gave a shard, like {_EXAMPLE}: lower-case letters, digits, '.' and '-', starting with a letter or "
        f"digit, at most {SHARD_ID_MAX} characters; `llmgw get replicas` shows each replica's shard")


def _problem(shard_id: str) -> str | None:
    if not isinstance(shard_id, str):
        return f"it is a {type(shard_id).__name__}, not a string"
    if not shard_id:
        return "it is empty"
    if len(shard_id) > SHARD_ID_MAX:
        return f"it is {len(shard_id)} characters long, over {SHARD_ID_MAX}"
    if "\0" in shard_id:
        return "it contains a NUL byte"
    if "/" in shard_id or "\\" in shard_id:
        return "it contains a path separator"
    if shard_id[0] == ".":
        return "it starts with '.'"
    if shard_id[0] == "-":
        return "it starts with '-', which a command would read as an option"
    if not _SHARD_ID.fullmatch(shard_id):
        bad = sorted({c for c in shard_id if not (c.isascii() and (c.islower() or c.isdigit() or c in ".-"))})
        return f"it contains {', '.join(repr(c) for c in bad)}"
    return None
