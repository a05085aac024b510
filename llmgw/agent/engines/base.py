"""What an engine adapter is: a pure translation from a shard spec to a process.

An adapter knows one engine's command line. It validates a spec before
anything is launched (an engine refuses a bad flag only after it has started,
and a big model only after minutes of loading), builds the argv and the
environment additions, and says which version of the engine is installed.
It starts no engine itself: the supervisor is the one place that spawns
engine processes, so adapters are tested with plain data (the one process an
adapter may run is a version probe, ``llama-server --version`` or a one-line
``importlib.metadata`` script in vLLM's or SGLang's python, which exits at once,
behind an injectable runner; the one file one writes is SGLang's 0600 config
holding the API key, in the shard's private work dir). For the same reason an
adapter says *where* to ask an engine how many requests it has in flight and
how to read the answer (``in_flight_probe``), and the supervisor asks.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from collections.abc import Callable, Iterable
from typing import Protocol

from llmgw.core import enginecheck, engines, errors, inventory, shards


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """How to start one engine process."""

    #: The full command line, program first; run without a shell.
    argv: list[str]
    #: Variables to add to (or override in) the agent's environment.
    env: dict[str, str]
    #: Whether this process answers HTTP (health, model list). False for a worker rank of an
    #: engine whose worker ranks serve none (``Engine.worker_ranks_serve_http``): it is judged
    #: by staying alive, and probing it would wait out the startup timeout.
    serves_http: bool = True
    #: The directory it runs in; "" for the agent's own. vLLM runs in its work dir so that its
    #: IPC sockets can be named relative to it (a socket's path is at most 107 bytes).
    cwd: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class TlsFiles:
    """The engine's own copy of the node's engine key and certificate (PEM files in its work dir), when it
    serves TLS (``llmgw.agent.enginetls``)."""

    key: str
    cert: str


#: (path, parser): the parser turns the body of a 200 answer into the number of
#: requests running or queued, or None when the body does not say.
InFlightProbe = tuple[str, Callable[[bytes], int | None]]


class Adapter(Protocol):
    """One engine's translation of a shard spec."""

    #: The engine's name as model files spell it ("llamacpp").
    name: str
    #: The path that answers 200 once the engine serves.
    health_path: str

    def validate(self, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
        """Raise EngineError, saying what to fix, when ``spec`` cannot run on this engine (on ``node``,
        with ``model``'s weights, when those are known)."""
        ...

    def launch(self, spec: shards.ShardSpec, *, host: str, port: int, model_path: str | None,
               cpu_count: int, node: enginecheck.NodeFacts = enginecheck.NodeFacts(), work_dir: str = "",
               python: str | None = None, tls: TlsFiles | None = None) -> Launch:
        """The argv and environment that run ``spec`` listening on ``host:port`` (with ``tls``: serving TLS with
        that key and certificate, else plain HTTP).

        ``node`` is this node's facts (GPU memory, management interface, HCAs);
        ``work_dir`` a directory the agent made for this shard alone (its TMPDIR
        and caches), "" when there is none; ``python`` the interpreter to run a
        Python engine with, None for the one configured for it (``configure``;
        the agent's own by default).
        """
        ...

    def probe(self) -> str | None:
        """The installed engine's version, None when it is not installed here.

        May be slow (an engine whose import takes seconds): the agent calls it
        off its event loop, at start and every few minutes, never per heartbeat.
        """
        ...

    def in_flight_probe(self) -> InFlightProbe:
        """The path to GET (with the shard's API key) and a parser of its body for requests in flight.

        Optional: the supervisor treats an adapter without it like one whose
        parser answers None, and a drain then waits out its timeout.
        """
        ...


def reserved_in(engine: str, args: Iterable[str]) -> list[str]:
    """The args that set a flag llmgw sets itself for ``engine`` (``--port 1`` and ``--port=1`` alike)."""
    return engines.reserved_in(engine, args)


def check_common(engine: str, spec: shards.ShardSpec, *, node: enginecheck.NodeFacts | None = None,
                 model: inventory.WeightFile | None = None) -> None:
    """The checks every adapter makes: a served name, sane threads, and every ``enginecheck`` problem.

    The engine version is not checked here: a shard does not carry the model
    file's ``engine_version`` (placement chose a node that has it).
    """
    if not spec.served_name:
        raise errors.EngineError(f"shard {spec.shard_id}: served_name is empty; set the name clients "
                                 "will ask for")
    if spec.threads < 0:
        raise errors.EngineError(f"shard {spec.shard_id}: threads is {spec.threads}; use 0 for the "
                                 "default or a positive count")
    found = enginecheck.problems(enginecheck.Profile.of_shard(dataclasses.replace(spec, engine=engine)),
                                 node, model)
    if found:
        raise errors.EngineError(f"shard {spec.shard_id}: {'; '.join(found)}")


def spec_env(spec: shards.ShardSpec) -> dict[str, str]:
    """The environment additions the spec itself asks for."""
    return dict(spec.env)


def api_key_env(engine: str, spec: shards.ShardSpec) -> dict[str, str]:
    """The shard's API key in the variable its engine reads (``Engine.api_key_env``); {} without a key.

    Never on argv: a command line is readable by every user of the node (``ps``,
    /proc/PID/cmdline), an environment only by the process's owner and root.
    """
    if not spec.api_key:
        return {}
    name = engines.ENGINES[engine].api_key_env
    if not name:
        raise errors.EngineError(f"engine {engine} reads no API key from its environment; llmgw does not put "
                                 "keys on a command line")
    return {name: spec.api_key}


def multinode_env(spec: shards.ShardSpec, node: enginecheck.NodeFacts) -> dict[str, str]:
    """NCCL's and Gloo's variables for one rank of a replica that spans nodes; {} for one node.

    * ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``: this node's own management
      interface (the one its management address is on), found by its agent.
      Never one name for the cluster: nodes of two hardware generations name it
      ``eth0`` and ``enp3s0f0``, and NCCL given a name a node lacks fails its
      bootstrap there. Unset when the node did not find it (NCCL then picks one).
    * ``NCCL_IB_HCA``: the adapters placement gave this rank, and only those, so
      two replicas on one node do not share a rail.
    * ``NCCL_IB_GID_INDEX``: on RoCE (an Ethernet link layer) NCCL needs the GID
      table index of the port's RoCE v2 address; its default (0, RoCE v1 on most
      NICs) does not route between subnets. Set when every given HCA's ports that
      carry RoCE agree on one index; InfiniBand needs none.
    """
    if spec.nnodes <= 1:
        return {}
    env: dict[str, str] = {}
    if node.mgmt_interface:
        env["NCCL_SOCKET_IFNAME"] = node.mgmt_interface
        env["GLOO_SOCKET_IFNAME"] = node.mgmt_interface
    if spec.hcas:
        env["NCCL_IB_HCA"] = ",".join(spec.hcas)
        given = [h for h in node.hcas if h.name in spec.hcas]
        indices = {p.roce_v2_gid_index for h in given for p in h.ports
                   if p.link_layer == "Ethernet" and p.roce_v2_gid_index >= 0}
        if len(indices) == 1:
            env["NCCL_IB_GID_INDEX"] = str(indices.pop())
    return env


def gpu_memory_fraction(spec: shards.ShardSpec, node: enginecheck.NodeFacts, *, low: float = 0.05,
                        high: float = 0.95) -> float | None:
    """The share of its GPUs' memory the replica was given (``gpu_memory_bytes`` / the smallest given GPU's
    total), clamped to [low, high] and rounded to 2 places; None when either is unknown.

    The smallest GPU, because the engine applies one fraction to each. Clamped: a
    fraction near 0 leaves no KV cache and one of 1 leaves nothing for the CUDA
    context and the allocator, and both fail only after the weights have loaded.
    """
    totals = [g.memory_total_bytes for g in node.gpus if g.index in spec.gpus and g.memory_total_bytes > 0]
    if not spec.gpus or spec.gpu_memory_bytes <= 0 or len(totals) != len(spec.gpus):
        return None
    fraction = spec.gpu_memory_bytes / min(totals)
    return round(min(high, max(low, fraction)), 2)


def work_dir_env(work_dir: str, names: Iterable[tuple[str, str]]) -> dict[str, str]:
    """``{VAR: work_dir/sub}`` for each (VAR, sub); {} without a work dir."""
    if not work_dir:
        return {}
    return {var: os.path.join(work_dir, sub) if sub else work_dir for var, sub in names}


def sum_gauges(body: bytes, names: Iterable[str]) -> int | None:
    """The sum of each named gauge over all its label sets in Prometheus text; None unless every one is there.

    ``vllm:num_requests_running{engine="0",model_name="m"} 2.0``: the name ends at
    ``{`` or a space, and the value follows the labels (which may hold spaces).
    """
    wanted = set(names)
    found: dict[str, float] = {}
    for line in body.decode("utf-8", errors="replace").splitlines():
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if 0 <= brace < space or (brace >= 0 and space < 0):
            name, rest = line[:brace], line[line.rfind("}") + 1:]
        else:
            name, rest = line[:space], line[space:]
        if name not in wanted:
            continue
        try:
            found[name] = found.get(name, 0.0) + float(rest.split()[0])
        except (ValueError, IndexError):
            return None
    if set(found) != wanted:
        return None
    return int(sum(found.values()))


#: Long enough for a python on a cold network filesystem; short enough for a heartbeat's rescan.
VERSION_TIMEOUT_S = 20.0
_VERSION_SCRIPT = ("import importlib.metadata as m\n"
                   "for d in {names!r}:\n"
                   "    try:\n"
                   "        print(m.version(d)); break\n"
                   "    except m.PackageNotFoundError:\n"
                   "        pass\n")


def run_python(argv: list[str]) -> str:
    """The stdout of ``argv`` (a python and its script); "" when it cannot run or fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=VERSION_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout if done.returncode == 0 else ""


def version_probe(python: str, distributions: tuple[str, ...], run: Callable[[list[str]], str]) -> str | None:
    """The first of ``distributions`` installed in ``python``'s environment; None when none is."""
    out = run([python, "-c", _VERSION_SCRIPT.format(names=distributions)]).strip()
    return out.splitlines()[-1] if out else None


class VersionCache:
    """A version asked again only when the python or its ``bin`` directory changes."""

    def __init__(self, distributions: tuple[str, ...], run: Callable[[list[str]], str]) -> None:
        self._distributions, self._run = distributions, run
        self._known: tuple[tuple[object, ...], str | None] | None = None

    def get(self, python: str) -> str | None:
        key = (python, *_stamp(python), *_stamp(os.path.dirname(python)))
        if self._known is None or self._known[0] != key:
            self._known = (key, version_probe(python, self._distributions, self._run))
        return self._known[1]


def _stamp(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def require_weights_dir(engine: str, spec: shards.ShardSpec) -> None:
    """EngineError unless ``spec`` names weights: the engines that load a model directory need one."""
    if not spec.source:
        raise errors.EngineError(f"shard {spec.shard_id}: {engine} needs weights; set spec.source to a directory "
                                 "holding config.json and *.safetensors (file:///models/name)")


def require_model_dir(spec: shards.ShardSpec, model_path: str | None) -> str:
    """``model_path`` itself; EngineError when the source resolved to nothing on this node."""
    if not model_path:
        raise errors.EngineError(f"shard {spec.shard_id}: no model directory was resolved for source "
                                 f"{spec.source!r}; set spec.source to a directory the node has")
    return model_path


def profile_flags(engine: str, spec: shards.ShardSpec, node: enginecheck.NodeFacts | None, *,
                  memory_flag: str) -> list[str]:
    """The flags for a shard's dtype, context and per-GPU memory share, in ``engine``'s own spelling.

    fp8 is a quantization to vLLM and SGLang (weights cast at load), not a ``--dtype`` choice; the
    context flag is the engine record's first; ``memory_flag`` takes the fraction of each given GPU.
    """
    flags: list[str] = []
    if spec.dtype == "fp8":
        flags += ["--quantization", "fp8"]
    elif spec.dtype:
        flags += ["--dtype", spec.dtype]
    if spec.context_length:
        flags += [engines.ENGINES[engine].context_flags[0], str(spec.context_length)]
    fraction = gpu_memory_fraction(spec, node)
    if fraction is not None:
        flags += [memory_flag, f"{fraction:.2f}"]
    return flags
