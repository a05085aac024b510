"""``spec.adapters``: LoRA adapters served on a model's replicas, each under a model name of its own.

A model file may list adapters::

    spec:
      engine: vllm
      source: hf://org/base
      adapters:
        - {name: base-sql, source: hf://org/sql-lora, rank: 16}
        - {name: base-chat, source: /srv/loras/chat}

Each adapter is fetched like weights (its ``source`` is read by ``llmgw.core.sources``, the one place
sources are read) and served by the base's engine under its ``name``, which clients give as ``model``.

What restarts an engine and what does not: the adapter list itself is loaded and unloaded at runtime
through the engine's API (vLLM's ``/v1/load_lora_adapter`` with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``),
so it is not in the fingerprint. The limits the engine is started with (``lora_limits``: LoRA on, the
largest rank rounded up to one vLLM accepts, how many adapters fit at once) are: an adapter whose rank
passes the running engine's ``--max-lora-rank`` cannot be loaded into it, so such a change rolls the
replicas, and only such a change.

Engines: vLLM and the sim (which mimics vLLM's routes) take adapters. SGLang and llama.cpp are refused
at apply, with why: llmgw does not yet load adapters into them at runtime (SGLang has ``--enable-lora``
and ``/load_lora_adapter``, llama.cpp only ``--lora FILE`` at start), and a spec whose adapters change
would silently not apply.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

from llmgw.core import sources
from llmgw.core.errors import SpecError
from llmgw.core.specfields import check_fields, integer, mapping, string

#: An adapter's name: as a model's (``metadata.name``), since it is a model name clients send.
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")
#: The engines llmgw loads adapters into at runtime.
ENGINES = ("vllm", "sim")
#: ``--max-lora-rank`` values vLLM 0.32 accepts (``vllm/config/lora.py``: ``MaxLoRARanks``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
#: The rank assumed for an adapter that does not say its own (vLLM's default ``--max-lora-rank``).
DEFAULT_RANK = 16
#: Adapters one replica holds on its accelerator at once, at least (``--max-loras``): adding adapters up
#: to it restarts nothing.
MIN_SLOTS = 4
#: ... and at most (``--max-loras`` and ``--max-cpu-loras``): a model with more registers them all on every
#: replica, each engine holding this many, least recently used evicted, the others loaded on demand, and
#: the router sends an adapter's requests where it is held (``core.adapteraffinity``).
MAX_SLOTS = 16
MAX_ADAPTERS = 64
#: The environment variable vLLM serves ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` under.
VLLM_RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
_FIELDS = ("name", "source", "rank")
_WHY_NOT = {
    "sglang": "llmgw does not yet load adapters into SGLang at runtime (its --enable-lora and /load_lora_adapter "
              "are not driven by the agent)",
    "llamacpp": "llama.cpp takes adapters only at start (--lora FILE), so a change to the list would need a "
                "restart, which llmgw does not do for adapters",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    source: str
    #: The LoRA rank, if the file says it (0: not said; DEFAULT_RANK is assumed for the engine's limit).
    rank: int = 0

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "source": self.source}
        if self.rank:
            doc["rank"] = self.rank
        return doc


@dataclasses.dataclass(frozen=True, slots=True)
class LoraLimits:
    """What an engine with adapters is started with: in the fingerprint, unlike the adapter list."""

    #: ``--max-lora-rank``: the largest adapter's rank, rounded up to a value vLLM accepts.
    max_rank: int
    #: ``--max-loras``: adapters in one batch (on the accelerator) at once.
    max_loras: int
    #: ``--max-cpu-loras``: adapters kept in host memory, loaded or not.
    max_cpu_loras: int


def parse_adapters(value: Any, engine: str, served: str, aliases: Iterable[str] = (), *,
                   stored: bool = False) -> tuple[Adapter, ...]:
    """``spec.adapters`` read and checked; SpecError names the entry and what to write instead."""
    if value is None or value == []:
        return ()
    if not isinstance(value, list):
        raise SpecError("spec.adapters", "expected a list such as [{name: my-lora, source: hf://org/repo}]")
    if engine not in ENGINES and not stored:
        why = _WHY_NOT.get(engine, f"engine {engine} serves no LoRA adapters")
        raise SpecError("spec.adapters", f"{why}; use engine vllm for adapters, or remove spec.adapters")
    if len(value) > MAX_ADAPTERS:
        raise SpecError("spec.adapters", f"at most {MAX_ADAPTERS} adapters per model, got {len(value)}")
    taken = {served, *aliases}
    out: list[Adapter] = []
    for i, item in enumerate(value):
        where = f"spec.adapters[{i}]"
        doc = mapping(item, where)
        check_fields(doc, _FIELDS, where)
        name = string(doc.get("name"), f"{where}.name").strip()
        if not NAME_RE.match(name):
            raise SpecError(f"{where}.name", f"{name!r} is not a valid name: use lower-case letters, digits, '-' "
                                             "and '.', start and end with a letter or digit, at most 63")
        if name in taken:
            raise SpecError(f"{where}.name", f"{name!r} is already a name of this model (its served name, an "
                                             "alias or another adapter); give each adapter a name of its own")
        taken.add(name)
        text = string(doc.get("source"), f"{where}.source").strip()
        try:
            source = sources.parse(text).text
        except sources.SourceError as exc:
            raise SpecError(f"{where}.source", exc.reason) from None
        rank = integer(doc.get("rank") or 0, f"{where}.rank", lo=0, hi=VLLM_RANKS[-1])
        out.append(Adapter(name=name, source=source, rank=rank))
    return tuple(out)


def lora_limits(adapters: tuple[Adapter, ...]) -> LoraLimits | None:
    """The engine's LoRA limits for ``adapters``; None without adapters (the engine runs without LoRA)."""
    if not adapters:
        return None
    rank = max(a.rank or DEFAULT_RANK for a in adapters)
    max_rank = next(r for r in VLLM_RANKS if r >= rank)
    slots = MIN_SLOTS
    while slots < min(len(adapters), MAX_SLOTS):  # powers of two: adding one rolls the replicas only at 4, 8, 16
        slots *= 2
    return LoraLimits(max_rank=max_rank, max_loras=slots, max_cpu_loras=slots)


def vllm_args(limits: LoraLimits) -> tuple[str, ...]:
    """vLLM 0.32's flags for ``limits`` (each in ``llmgw/testing/engineflags/vllm-0.32.0.json``)."""
    return ("--enable-lora", "--max-lora-rank", str(limits.max_rank), "--max-loras", str(limits.max_loras),
            "--max-cpu-loras", str(limits.max_cpu_loras))


#: The flags ``spec.adapters`` sets; engine_args may not set them too.
LORA_FLAGS = ("--enable-lora", "--no-enable-lora", "--max-lora-rank", "--max-loras", "--max-cpu-loras",
              "--lora-modules")


def check_args(engine_args: tuple[str, ...], env: tuple[tuple[str, str], ...]) -> None:
    """With adapters, LoRA's flags and runtime variable are llmgw's to set: SpecError for one set by hand."""
    for i, arg in enumerate(engine_args):
        flag = arg.split("=", 1)[0]
        if flag in LORA_FLAGS:
            raise SpecError(f"spec.engine_args[{i}]", f"{flag} is set by llmgw from spec.adapters; remove it "
                                                      "from engine_args")
    for key, _ in env:
        if key == VLLM_RUNTIME_ENV:
            raise SpecError(f"spec.env.{key}", "set by llmgw for a model with spec.adapters; remove it from env")


def launch_args(engine: str, adapters: tuple[Adapter, ...]) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """The flags and environment an engine serving ``adapters`` is started with (nothing without adapters)."""
    limits = lora_limits(adapters)
    if limits is None or engine not in ENGINES:  # the sim takes vLLM's flags and variable (``llmgw.sim.engine.lora``)
        return (), ()
    return vllm_args(limits), ((VLLM_RUNTIME_ENV, "True"),)


def names(adapters: Iterable[Adapter]) -> tuple[str, ...]:
    return tuple(a.name for a in adapters)


def check_unique(name: str, served: str, aliases: tuple[str, ...], listed: tuple[Adapter, ...],
                 others: Iterable[tuple[str, str, tuple[str, ...], tuple[Adapter, ...]]]) -> None:
    """SpecError when an adapter's name is another model's name, or a name of this model another's adapter.

    ``others``: every other model's (name, served name, aliases, adapters). A router finds a model's own
    names before any adapter's, so a clash would silently send an adapter's requests to another model.
    """
    own = {name, served, *aliases}
    for other, o_served, o_aliases, o_adapters in others:
        if other == name:
            continue
        taken = {other, o_served, *o_aliases, *(a.name for a in o_adapters)}
        for i, a in enumerate(listed):
            if a.name in taken:
                raise SpecError(f"spec.adapters[{i}].name", f"{a.name!r} is already a name of model {other}; give "
                                                             "the adapter a name no other model uses")
        for clash in own & {a.name for a in o_adapters}:
            raise SpecError("spec", f"{clash!r} is the name of an adapter of model {other}; choose another name, "
                                    "or remove that adapter first")
