"""Engine adapters, one per engine, looked up by the name a model file uses.

Adapters are pure (llmgw.core and the standard library only); see ``base``.
vLLM and SGLang live in environments of their own: ``configure`` gives their
adapters the python to run them with (the agent's settings ``engine_python``).
"""

from __future__ import annotations

import sys

from llmgw.agent.engines import base, llamacpp, sglang, sim, vllm
from llmgw.core import errors

Adapter = base.Adapter
Launch = base.Launch
InFlightProbe = base.InFlightProbe

#: Engines run by a python of their own, configurable per node.
PYTHON_ENGINES = ("vllm", "sglang")


def _build(python_for: dict[str, str]) -> dict[str, base.Adapter]:
    return {
        "llamacpp": llamacpp.LlamaCpp(),
        "sim": sim.Sim(),
        "vllm": vllm.Vllm(python=python_for.get("vllm") or sys.executable),
        "sglang": sglang.Sglang(python=python_for.get("sglang") or sys.executable),
    }


_ADAPTERS: dict[str, base.Adapter] = _build({})


def configure(python_for: dict[str, str]) -> None:
    """Rebuild the registry with the python each engine runs under ({"vllm": "/opt/vllm/bin/python"}).

    An engine not named runs under the agent's own python. A name that is no
    Python engine is refused, so a typo in the settings is not silently ignored.
    """
    unknown = sorted(set(python_for) - set(PYTHON_ENGINES))
    if unknown:
        raise errors.EngineError(f"engine_python names {', '.join(unknown)}, which llmgw does not run with a "
                                 f"python of their own; name only {', '.join(PYTHON_ENGINES)}")
    _ADAPTERS.clear()
    _ADAPTERS.update(_build(python_for))


def get(name: str) -> base.Adapter:
    """The adapter for engine ``name``; EngineError naming the known engines otherwise."""
    try:
        return _ADAPTERS[name]
    except KeyError:
        raise errors.EngineError(f"unknown engine {name!r}; known engines: {', '.join(sorted(_ADAPTERS))}"
                                 ) from None


def available() -> list[tuple[str, str]]:
    """(name, version) of each engine installed on this machine.

    Slow the first time (each Python engine's version is asked in its python);
    the agent calls it off its event loop.
    """
    found = []
    for name, adapter in sorted(_ADAPTERS.items()):
        version = adapter.probe()
        if version is not None:
            found.append((name, version))
    return found
