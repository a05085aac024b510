"""Engine adapters, one per engine, looked up by the name a model file uses.

Adapters are pure (llmgw.core and the standard library only); see ``base``.
vLLM and SGLang live in environments of their own: ``configure`` gives their
adapters the python to run them with (the agent's settings ``engine_python``).

Engines llmgw installed (``llmgw.agent.provision``) come in through ``set_installed``: a Ready install
of an engine is what its shards run with: the newest Ready one that matches the shard's
``engine_version`` (its model's; "" matches any), else the engine as configured.
What a node reports it can run (``available``) is its Ready installs, the engines its settings name in
``engine_python`` that answer their probe, the sim (built in), and, when ``own_python`` is on (the
default, which keeps ``make up`` and a pip-installed llmgw working), whatever the agent's own python has.
"""

from __future__ import annotations

import dataclasses
import sys

from llmgw.agent.engines import base, llamacpp, sglang, sim, vllm
from llmgw.core import engines as engine_records
from llmgw.core import errors

Adapter = base.Adapter
Launch = base.Launch
InFlightProbe = base.InFlightProbe

#: Engines run by a python of their own, configurable per node.
PYTHON_ENGINES = ("vllm", "sglang")


@dataclasses.dataclass(frozen=True, slots=True)
class Installed:
    """A Ready install: the engine, its version, the install's python and (the sim) the module it runs."""

    engine: str
    version: str
    python: str
    module: str = ""


def _version_key(version: str) -> tuple[tuple[int, object], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in version.replace("-", ".").split("."))


def _build(python_for: dict[str, str], installed: tuple[Installed, ...] = ()) -> dict[str, base.Adapter]:
    newest: dict[str, Installed] = {}
    for i in sorted(installed, key=lambda i: _version_key(i.version)):
        newest[i.engine] = i
    own: dict[str, base.Adapter] = {
        "llamacpp": llamacpp.LlamaCpp(),
        "sim": sim.Sim(),
        "vllm": vllm.Vllm(python=python_for.get("vllm") or sys.executable),
        "sglang": sglang.Sglang(python=python_for.get("sglang") or sys.executable),
    }
    for name, i in newest.items():
        own[name] = _installed_adapter(i)
    return own


def _installed_adapter(i: Installed) -> base.Adapter:
    if i.engine == "sim":
        return sim.Sim(python=i.python, module=i.module or sim.MODULE, version=i.version)
    if i.engine == "llamacpp":
        return llamacpp.LlamaCpp(python=i.python, version=i.version)
    if i.engine == "vllm":
        return vllm.Vllm(python=i.python)
    return sglang.Sglang(python=i.python)


_ADAPTERS: dict[str, base.Adapter] = _build({})
#: The adapters as configured, without installs: what ``available`` probes beside the installs.
_CONFIGURED: dict[str, base.Adapter] = _build({})
_STATE: dict[str, object] = {"python_for": {}, "installed": (), "own_python": True}


def configure(python_for: dict[str, str], *, own_python: bool = True) -> None:
    """Rebuild the registry with the python each engine runs under ({"vllm": "/opt/vllm/bin/python"}).

    An engine not named runs under the agent's own python. A name that is no
    Python engine is refused, so a typo in the settings is not silently ignored.
    ``own_python`` False: the agent's own python's engines (but the sim) are not reported.
    """
    unknown = sorted(set(python_for) - set(PYTHON_ENGINES))
    if unknown:
        raise errors.EngineError(f"engine_python names {', '.join(unknown)}, which llmgw does not run with a "
                                 f"python of their own; name only {', '.join(PYTHON_ENGINES)}")
    _STATE.update(python_for=dict(python_for), own_python=own_python)
    _CONFIGURED.clear()
    _CONFIGURED.update(_build(dict(python_for)))
    _rebuild()


def set_installed(installed: tuple[Installed, ...]) -> None:
    """The Ready installs, from the installer whenever they change."""
    _STATE["installed"] = tuple(installed)
    _rebuild()


def _rebuild() -> None:
    built = _build(dict(_STATE["python_for"]), tuple(_STATE["installed"]))  # type: ignore[call-overload,arg-type]
    _ADAPTERS.clear()
    _ADAPTERS.update(built)


def get(name: str, version: str = "") -> base.Adapter:
    """The adapter for engine ``name``: the newest Ready install matching ``version`` (its model's
    ``engine_version``; "" any), else the engine as configured; EngineError naming the known engines otherwise.
    """
    matching = [i for i in _STATE["installed"] if isinstance(i, Installed) and i.engine == name  # type: ignore[attr-defined]
                and engine_records.version_matches(i.version, version)]
    if version and matching:
        return _installed_adapter(max(matching, key=lambda i: _version_key(i.version)))
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
    installed: tuple[Installed, ...] = _STATE["installed"]  # type: ignore[assignment]
    python_for: dict[str, str] = _STATE["python_for"]  # type: ignore[assignment]
    found = [(i.engine, i.version) for i in installed]
    for name, adapter in sorted(_CONFIGURED.items()):
        if not (name == "sim" or name in python_for or _STATE["own_python"]):
            continue
        version = adapter.probe()
        if version is not None and (name, version) not in found:
            found.append((name, version))
    return sorted(found)
