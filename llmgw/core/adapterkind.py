"""``kind: Adapter``: a LoRA adapter applied and deleted on its own, joining its base model's adapters.

An adapter file::

    apiVersion: llmgw/v1
    kind: Adapter
    metadata: {name: base-sql}
    spec: {base: my-model, source: hf://org/sql-lora, rank: 16}

joins model ``my-model``'s adapters as an entry of its ``spec.adapters`` would (the same checks: a name
no model uses, a source ``core.sources`` reads, an engine that takes adapters), without editing the
model's file.

How it is stored, with no migration and so that 0.2.0 reads it beside this release: inside the base
model's stored manifest. The adapter is an entry of its ``spec.adapters`` (0.2.0 serves it as it serves
any listed adapter), and the names applied on their own are the value of the label ``ATTACHED_LABEL``
(``"base-sql,base-chat"``; 0.2.0 reads labels as free strings). Re-applying the model's own file keeps
them (``carry``): the file says the model, the label says what was applied beside it. A model's
``kind: Model`` row is the only row: 0.2.0 would refuse a row of a kind it does not know when it lists
models, which would fail every listing.

Deleting a model that has adapters applied on their own is refused, naming them: delete them first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from llmgw.core import adapters as adapters_mod
from llmgw.core.errors import SpecError
from llmgw.core.specfields import check_fields, header, mapping, string
from llmgw.core.specmodel import API_VERSION, Model

KIND = "Adapter"
#: The base model's label that names its adapters applied as ``kind: Adapter`` (comma-separated).
ATTACHED_LABEL = "llmgw.io/adapters"
#: 0.2.0 refuses a label value longer than this (``specs.parse_labels``).
MAX_LABEL = 253
_SPEC_FIELDS = ("base", "source", "rank")


@dataclasses.dataclass(frozen=True, slots=True)
class AdapterManifest:
    """One ``kind: Adapter`` document: the adapter and the model it runs on."""

    base: str
    adapter: adapters_mod.Adapter

    @property
    def name(self) -> str:
        return self.adapter.name

    def to_manifest(self) -> dict[str, Any]:
        spec = {k: v for k, v in self.adapter.to_doc().items() if k != "name"}
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name},
                "spec": {"base": self.base, **spec}}


def is_adapter(doc: Any) -> bool:
    return isinstance(doc, Mapping) and doc.get("kind") == KIND


def parse(doc: Any) -> AdapterManifest:
    """A ``kind: Adapter`` document checked; SpecError names the field and what to write."""
    meta = header(doc, kind=KIND, api_version=API_VERSION, meta_fields=("name",))
    spec = mapping(doc.get("spec"), "spec")
    check_fields(spec, _SPEC_FIELDS, "spec")
    base = string(spec.get("base"), "spec.base").strip()
    if not base:
        raise SpecError("spec.base", "required: the name of the model (metadata.name) this adapter runs on")
    entry = {"name": meta.get("name"), **{k: v for k, v in spec.items() if k != "base"}}
    try:
        # No engine is known yet: "vllm" passes the engine check, made against the base in ``attach``.
        (adapter,) = adapters_mod.parse_adapters([entry], "vllm", "")
    except SpecError as e:
        raise SpecError(_field(e.field), e.reason) from None
    return AdapterManifest(base=base, adapter=adapter)


def _field(field: str) -> str:
    rest = field.removeprefix("spec.adapters[0]").lstrip(".")
    return "metadata.name" if rest == "name" else f"spec.{rest}" if rest else "spec"


def attached(model: Model) -> tuple[str, ...]:
    """The names of ``model``'s adapters applied on their own (listed in the label and in spec.adapters)."""
    raw = dict(model.labels).get(ATTACHED_LABEL, "")
    listed = {a.name for a in model.spec.adapters}
    return tuple(n for n in dict.fromkeys(p.strip() for p in raw.split(",")) if n and n in listed)


def _with(model: Model, adapters: tuple[adapters_mod.Adapter, ...], names: tuple[str, ...]) -> Model:
    labels = {k: v for k, v in model.labels if k != ATTACHED_LABEL}
    if names:
        value = ",".join(names)
        if len(value) > MAX_LABEL:
            raise SpecError("metadata.name", f"model {model.name} has too many adapters applied on their own to "
                                             f"record ({len(names)}); list them in its spec.adapters instead")
        labels[ATTACHED_LABEL] = value
    return dataclasses.replace(model, labels=tuple(sorted(labels.items())),
                               spec=dataclasses.replace(model.spec, adapters=adapters))


def attach(base: Model, item: AdapterManifest) -> Model:
    """``base`` with ``item``'s adapter joined (or replaced, when applied before); SpecError when it cannot."""
    if base.spec.engine not in adapters_mod.ENGINES:
        why = adapters_mod.why_not(base.spec.engine)
        raise SpecError("spec.base", f"model {base.name} runs engine {base.spec.engine}: {why}")
    mine = attached(base)
    if item.name in {a.name for a in base.spec.adapters} and item.name not in mine:
        raise SpecError("metadata.name", f"{item.name!r} is listed in model {base.name}'s spec.adapters; change "
                                         "it there, or give this adapter another name")
    kept = tuple(a for a in base.spec.adapters if a.name != item.name)
    names = (*(n for n in mine if n != item.name), item.name)
    return _with(base, (*kept, item.adapter), names)


def detach(base: Model, name: str) -> Model:
    """``base`` without its adapter ``name`` applied on its own; SpecError when it is not one."""
    if name not in attached(base):
        raise SpecError("metadata.name", f"{name!r} is listed in model {base.name}'s spec.adapters, not applied on "
                                         "its own; remove it there and apply the model")
    return _with(base, tuple(a for a in base.spec.adapters if a.name != name),
                 tuple(n for n in attached(base) if n != name))


def carry(stored: Model | None, new: Model) -> Model:
    """``new`` (a model file applied) with the adapters ``stored`` had applied on their own kept.

    The label in ``new`` only keeps what was stored: a name it gives that was not applied on its own is
    dropped. An adapter applied on its own that the file lists too stays applied on its own when the file's
    label names it (the file is the model as ``llmgw get model -o yaml`` wrote it, edited), and is the file's
    from then on when it does not (the file took it over).
    """
    listed = {a.name for a in new.spec.adapters}
    mine = attached(stored) if stored is not None else ()
    said = set(dict(new.labels).get(ATTACHED_LABEL, "").split(","))
    keep = tuple(a for a in (stored.spec.adapters if stored is not None else ())
                 if a.name in mine and a.name not in listed)
    stays = tuple(n for n in mine if n in listed and n in said)
    return _with(new, (*new.spec.adapters, *keep), (*stays, *(a.name for a in keep)))


def entries(model: Model) -> list[dict[str, Any]]:
    """``model``'s adapters as ``GET /api/v1/adapters`` lists them: each with its base and where it was said."""
    mine = attached(model)
    return [{"name": a.name, "base": model.name, "source": a.source, "rank": a.rank,
             "applied": "Adapter" if a.name in mine else "Model"} for a in model.spec.adapters]
