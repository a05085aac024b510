"""What an engine adapter is: a pure translation from a shard spec to a process.

An adapter knows one engine's command line. It validates a spec before
anything is launched (an engine refuses a bad flag only after it has started,
and a big model only after minutes of loading), builds the argv and the
environment additions, and says which version of the engine is installed.
It starts no engine itself: the supervisor is the one place that spawns
engine processes, so adapters are tested with plain data (the one process an
adapter may run is a version probe such as ``llama-server --version``, which
exits at once, behind an injectable runner). For the same reason an
adapter says *where* to ask an engine how many requests it has in flight and
how to read the answer (``in_flight_probe``), and the supervisor asks.
"""

from __future__ import annotations

import dataclasses
import sys
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
               python: str = sys.executable) -> Launch:
        """The argv and environment that run ``spec`` listening on ``host:port``.

        ``node`` is this node's facts (GPU memory, management interface, HCAs);
        ``work_dir`` a directory the agent made for this shard alone (its TMPDIR
        and caches), "" when there is none.
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
    reserved = engines.reserved_flags(engine)
    return [a for a in args if a.split("=", 1)[0] in reserved]


def check_common(engine: str, spec: shards.ShardSpec) -> None:
    """The checks every adapter makes: a served name, and no reserved flags in args."""
    if not spec.served_name:
        raise errors.EngineError(f"shard {spec.shard_id}: served_name is empty; set the name clients "
                                 "will ask for")
    clashes = reserved_in(engine, spec.args)
    if clashes:
        raise errors.EngineError(
            f"shard {spec.shard_id}: engine args {' '.join(clashes)} set flags llmgw sets itself for "
            f"{engine} ({', '.join(sorted(engines.reserved_flags(engine)))}); remove them from the "
            "model's engine args")
    if spec.threads < 0:
        raise errors.EngineError(f"shard {spec.shard_id}: threads is {spec.threads}; use 0 for the "
                                 "default or a positive count")


def spec_env(spec: shards.ShardSpec) -> dict[str, str]:
    """The environment additions the spec itself asks for."""
    return dict(spec.env)
