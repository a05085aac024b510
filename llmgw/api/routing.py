"""The wire between the control plane and its routers, as typed documents: the one contract both sides read.

Three documents cross it, each a frozen dataclass with ``to_doc()`` (the JSON-able dict that is sent) and
``from_doc()`` (the dict read back):

- ``EndpointsDoc``: the route table the control plane publishes (``GET /api/v1/endpoints``, long-polled):
  every model's names, ready endpoints, unhealthy replicas, limits and autoscale bounds, the API keys, and
  the cluster CA engines serving TLS are verified with (``engine_ca``).
  Read by routers, so ``from_doc`` is tolerant: a field it does not know is ignored and an optional field
  that is malformed is warned about and left out (a newer control plane must not break an older router;
  refusing the table would leave the router serving an old one). What the router cannot route without
  (a model's name, an endpoint's URL, the unhealthy list) is refused with ``BadTable`` naming the field.
- ``RouterReport`` (``llmgw.api.reports``): what a router saw (replicas ejected and recovered, keys used).
- ``LoadReport`` (``llmgw.api.reports``): a router's load per model, the autoscaler's input.
  Both are read by the control plane, so their ``from_doc`` is strict: a bad report is refused with
  ``BadReport`` naming the field (the REST API's 422 sentence), and nothing of it applies.

A model's entry in the table (``ModelEntry`` and its parts) and its tolerant reading are ``llmgw.api.routemodels``,
re-exported here.

Standard library and ``llmgw.core`` only: the control plane and the router both import this module, and
never each other. Inside ``llmgw server`` the objects are handed over as they are, without JSON.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

from llmgw.api.reports import (
    BadReport,
    Ejected,
    KeyUsed,
    LoadReport,
    ModelLoad,
    Recovered,
    RouterEvent,
    RouterReport,
    WireError,
)
from llmgw.api.routemodels import (
    AutoscaleHint,
    BadTable,
    EndpointDoc,
    ModelEntry,
    UnhealthyDoc,
    is_int,
    read_model,
)
from llmgw.core import queueclasses, quota

__all__ = ["AuthDoc", "AutoscaleHint", "BadReport", "BadTable", "Ejected", "EndpointDoc", "EndpointsDoc", "KeyEntry",
           "KeyUsed", "LoadReport", "ModelEntry", "ModelLoad", "ProjectEntry", "Recovered", "RouterEvent",
           "RouterReport",
           "UnhealthyDoc", "WireError"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class KeyEntry:
    """An API key routers accept: the sha256 of its secret (hex), its scope and its limits."""

    id: str
    sha256: str
    models: tuple[str, ...] = ()  # empty: every model
    rpm: int = 0  # 0: unlimited
    tpm: int = 0
    priority: int = 0
    project: str = quota.DEFAULT_PROJECT
    user: str = ""  # the user the key was made for; "": none in particular
    #: The key's budgets beyond rpm/tpm (``core.quota.Limits``); rpm and tpm are its requests/tokens per minute.
    limits: quota.Limits = quota.Limits()
    #: Its priority class and weight (issue 32, ``core.queueclasses``); "" and 0: its project's.
    priority_class: str = ""
    weight: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"id": self.id, "sha256": self.sha256, "models": list(self.models), "rpm": self.rpm,
                               "tpm": self.tpm, "priority": self.priority, "project": self.project}
        if self.user:
            doc["user"] = self.user
        if self.limits.any:
            doc["limits"] = self.limits.to_doc()
        _queueing(doc, self.priority_class, self.weight)
        return doc


@dataclasses.dataclass(frozen=True, slots=True)
class ProjectEntry:
    """A project with budgets, a priority class or a weight: routers apply them to every key of the project."""

    name: str
    limits: quota.Limits = quota.Limits()
    priority_class: str = ""  # "": interactive
    weight: float = 0.0  # 0: 1

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"name": self.name, "limits": self.limits.to_doc()}
        _queueing(doc, self.priority_class, self.weight)
        return doc


def _queueing(doc: dict[str, Any], priority_class: str, weight: float) -> None:
    # Only when set: a table without them is the same bytes as before (and 0.2.0 routers ignore them).
    if priority_class:
        doc["priority_class"] = priority_class
    if weight:
        doc["weight"] = weight


@dataclasses.dataclass(frozen=True, slots=True)
class AuthDoc:
    """The API keys; ``required`` once any key exists (disabled ones count: all disabled is everyone refused)."""

    required: bool = False
    keys: tuple[KeyEntry, ...] = ()
    #: The projects that have budgets, a class or a weight (a project without any is not listed).
    projects: tuple[ProjectEntry, ...] = ()
    #: The cluster's priority classes, highest first (issue 32, the cluster setting ``priority_classes``).
    priority_classes: tuple[str, ...] = queueclasses.DEFAULT_CLASSES

    def to_doc(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"required": self.required, "keys": [k.to_doc() for k in self.keys]}
        if self.projects:
            doc["projects"] = [p.to_doc() for p in self.projects]
        if self.priority_classes != queueclasses.DEFAULT_CLASSES:
            doc["priority_classes"] = list(self.priority_classes)
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> AuthDoc:
        """Tolerant: a missing or malformed ``auth`` (an older control plane) is no keys; a bad key is skipped."""
        return doc if isinstance(doc, AuthDoc) else _auth(doc)


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointsDoc:
    """The route table at one version: what ``GET /api/v1/endpoints`` answers.

    The control plane builds it from its store (``models`` and ``auth``) and numbers it when it
    publishes (``with_version``); ``same_routes`` says whether a new build changes anything a router reads.
    """

    version: int = 0
    models: tuple[ModelEntry, ...] = ()
    auth: AuthDoc = AuthDoc()
    #: The cluster CA's certificate (PEM; never its key): an ``https://`` endpoint must present an engine
    #: certificate it issued for the endpoint's node (``llmgw.core.pki.engine_node``). "": none given.
    engine_ca: str = ""

    def with_version(self, version: int) -> EndpointsDoc:
        return dataclasses.replace(self, version=version)

    def same_routes(self, other: EndpointsDoc) -> bool:
        """Everything but the version is equal: a key created or deleted is a change too."""
        return self.models == other.models and self.auth == other.auth and self.engine_ca == other.engine_ca

    def to_doc(self) -> dict[str, Any]:
        doc = {"version": self.version, "models": [m.to_doc() for m in self.models], "auth": self.auth.to_doc()}
        if self.engine_ca:
            doc["engine_ca"] = self.engine_ca
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> EndpointsDoc:
        """Read a document as a router does: unknown fields ignored; ``BadTable`` names what cannot be routed."""
        if isinstance(doc, EndpointsDoc):
            return doc
        if not isinstance(doc, Mapping):
            raise BadTable(f"endpoints document: expected an object, got {type(doc).__name__}")
        version = doc.get("version")
        if not is_int(version):
            raise BadTable(f"version: expected an integer, got {version!r}")
        raw_models = doc.get("models", [])
        if not isinstance(raw_models, list):
            raise BadTable("models: expected a list")
        engine_ca = doc.get("engine_ca") or ""
        if not isinstance(engine_ca, str):
            # Not refused: the router still routes; an https endpoint is then refused at connect, not trusted.
            log.warning("engine_ca: expected a PEM certificate, got %r; https:// engines are not trusted",
                        type(engine_ca).__name__)
            engine_ca = "not a PEM certificate"
        return cls(version=version, models=tuple(read_model(f"models[{i}]", raw) for i, raw in enumerate(raw_models)),
                   auth=AuthDoc.from_doc(doc.get("auth")), engine_ca=engine_ca)


# -- reading the keys, as a router: tolerant (a bad key is skipped, a bad limit warned about) ---------------
def _auth(doc: Any) -> AuthDoc:
    if not isinstance(doc, Mapping):
        return AuthDoc()
    keys = []
    raw_keys = doc.get("keys")
    for raw in raw_keys if isinstance(raw_keys, list) else ():
        if not isinstance(raw, Mapping) or not isinstance(raw.get("sha256"), str):
            continue
        models = raw.get("models")
        priority = raw.get("priority")
        keys.append(KeyEntry(
            id=str(raw.get("id", "")), sha256=raw["sha256"],
            models=tuple(m for m in models if isinstance(m, str)) if isinstance(models, list) else (),
            rpm=_positive(raw.get("rpm")), tpm=_positive(raw.get("tpm")),
            priority=priority if is_int(priority) else 0,
            project=raw["project"] if isinstance(raw.get("project"), str) and raw["project"] else quota.DEFAULT_PROJECT,
            user=raw["user"] if isinstance(raw.get("user"), str) else "",
            limits=_limits(f"auth.keys[{raw.get('id', '')}]", raw.get("limits")), **_read_queueing(raw)))
    projects = []
    raw_projects = doc.get("projects")
    for raw in raw_projects if isinstance(raw_projects, list) else ():
        if isinstance(raw, Mapping) and isinstance(raw.get("name"), str):
            projects.append(ProjectEntry(name=raw["name"], limits=_limits(f"auth.projects[{raw['name']}]",
                                                                          raw.get("limits")), **_read_queueing(raw)))
    classes = doc.get("priority_classes")
    if classes is None or (why := queueclasses.classes_refusal(classes if isinstance(classes, list) else [classes])):
        if classes is not None:
            log.warning("auth.%s; the default classes are used", why)
        classes = queueclasses.DEFAULT_CLASSES
    return AuthDoc(required=bool(doc.get("required")), keys=tuple(keys), projects=tuple(projects),
                   priority_classes=tuple(classes))


def _read_queueing(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A key's or project's class and weight, tolerantly: a malformed one is left out (its project's, else 1)."""
    klass, weight = raw.get("priority_class", ""), raw.get("weight", 0.0)
    return {"priority_class": klass if isinstance(klass, str) and queueclasses.NAME.match(klass) else "",
            "weight": float(weight) if queueclasses.weight_refusal(weight) is None else 0.0}


def _limits(where: str, value: Any) -> quota.Limits:
    if isinstance(value, Mapping) and (newer := sorted(k for k in value if k not in quota.KINDS)):
        # A kind of limit a newer control plane has and this router does not (the skew policy lets a control
        # plane be one release ahead): the limits it knows are kept and applied, not all dropped with it.
        log.warning("%s.limits: %s is not a limit this router knows (is the control plane newer?); its other limits "
                    "are applied", where, ", ".join(str(k) for k in newer))
        value = {k: v for k, v in value.items() if k in quota.KINDS}
    try:
        return quota.Limits.from_doc(value)
    except (quota.BadLimits, TypeError) as exc:
        # Not silently "no limit": a limit the router cannot read is warned about each table.
        log.warning("%s.limits: %s; its limits are not applied", where, exc)
        return quota.Limits()


def _positive(value: Any) -> int:
    return value if is_int(value) and value > 0 else 0
