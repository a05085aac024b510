"""Engine adapters, one per engine, looked up by the name a model file uses.

Adapters are pure (llmgw.core and the standard library only); see ``base``.
"""

from __future__ import annotations

from llmgw.agent.engines import base, llamacpp, sim
from llmgw.core import errors

Adapter = base.Adapter
Launch = base.Launch
InFlightProbe = base.InFlightProbe

_ADAPTERS: dict[str, base.Adapter] = {
    "llamacpp": llamacpp.LlamaCpp(),
    "sim": sim.Sim(),
}


def get(name: str) -> base.Adapter:
    """The adapter for engine ``name``; EngineError naming the known engines otherwise."""
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise errors.EngineError(f"unknown engine {name!r}; known engines: {', '.join(sorted(_ADAPTERS))}"
                                 ) from None


def available() -> list[tuple[str, str]]:
    """(name, version) of each engine installed on this machine."""
    found = []
    for name, adapter in sorted(_ADAPTERS.items()):
        version = adapter.probe()
        if version is not None:
            found.append((name, version))
    return found
