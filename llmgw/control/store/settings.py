"""The cluster's spec policy settings (issue 24): a typed document, read and written in the store.

Four keys today, each a row of ``cluster_settings`` with a JSON value:

- ``allowed_env``: exact environment variable names a model's ``env`` may set beyond its engine's
  documented knobs (``llmgw.core.envpolicy``). A name no model may set whatever the settings (a
  loader, path or llmgw variable) is refused here too, so the list never claims what apply refuses.
- ``allow_remote_code``: whether ``engine_args`` may carry flags that run or load code or files the
  model file names (``--trust-remote-code``, ``llmgw.core.flagpolicy``).
- ``priority_classes`` (issue 32): the requests' priority classes, highest first (``core.queueclasses``); routers
  get them in the table.
- ``sso_required`` (issue 28): password logins refused for every user but ``sso_break_glass`` (a local
  admin kept for when the identity provider is down); a cluster setting, not a server flag, so that an
  admin changes it without a restart, for every control plane at once, audited.

Functions over a ``Store`` (beside its per-concern parts: a typed document of its own), which the
REST module runs on the store's thread (``StoreThread.call``). Writes are fenced like every other
write: a deposed leader's change is refused.
"""

from __future__ import annotations

import time
from typing import Any

import pydantic
import sqlalchemy as sa

from llmgw.control.store.store import Store
from llmgw.control.store.tables import ClusterSettingRow
from llmgw.core import envpolicy, queueclasses

MAX_ALLOWED_ENV = 500


class ClusterSettings(pydantic.BaseModel):
    """The whole settings document: what ``GET /api/v1/settings`` answers (defaults for keys never set)."""

    model_config = pydantic.ConfigDict(extra="forbid")

    #: Exact names a model's env may set beyond its engine's documented knobs.
    allowed_env: list[str] = pydantic.Field(default_factory=list, max_length=MAX_ALLOWED_ENV)
    #: Whether engine flags that run or load code a model file names are accepted.
    allow_remote_code: bool = False
    #: Password logins refused for everyone but ``sso_break_glass``: users sign in through single sign-on.
    sso_required: bool = False
    #: The one local user who may still log in with a password when ``sso_required`` is on.
    sso_break_glass: str = pydantic.Field(default="admin", max_length=63)
    #: The priority classes, highest first: ``interactive`` among them, ``batch`` last (issue 32).
    priority_classes: list[str] = pydantic.Field(default_factory=lambda: list(queueclasses.DEFAULT_CLASSES),
                                                 max_length=queueclasses.MAX_CLASSES)

    @pydantic.field_validator("allowed_env")
    @classmethod
    def _names(cls, names: list[str]) -> list[str]:
        for name in names:
            why = envpolicy.allowed_env_refusal(name)
            if why is not None:
                raise ValueError(why)
        return sorted(set(names))

    @pydantic.field_validator("priority_classes")
    @classmethod
    def _classes(cls, names: list[str]) -> list[str]:
        why = queueclasses.classes_refusal(names)
        if why is not None:
            raise ValueError(why.removeprefix("priority_classes: "))
        return names


class SettingsChange(pydantic.BaseModel):
    """A ``PUT /api/v1/settings`` body: the keys to change; a key left out keeps its value."""

    model_config = pydantic.ConfigDict(extra="forbid")

    allowed_env: list[str] | None = pydantic.Field(default=None, max_length=MAX_ALLOWED_ENV)
    allow_remote_code: pydantic.StrictBool | None = None
    sso_required: pydantic.StrictBool | None = None
    sso_break_glass: str | None = pydantic.Field(default=None, min_length=1, max_length=63)
    priority_classes: list[str] | None = pydantic.Field(default=None, max_length=queueclasses.MAX_CLASSES)

    def values(self) -> dict[str, Any]:
        """The keys given, validated as the document validates them."""
        given = self.model_dump(exclude_none=True)
        return ClusterSettings(**given).model_dump(include=set(given))


def read(store: Store) -> ClusterSettings:
    """The settings as stored; a key never set has its default, and a stored value a later version
    refuses (a name ruled out since) is left out rather than failing every apply."""
    with store._session() as s:
        rows = {r.key: r.value for r in s.scalars(sa.select(ClusterSettingRow))}
    doc: dict[str, Any] = {}
    for key in ("allow_remote_code", "sso_required"):
        if isinstance(rows.get(key), bool):
            doc[key] = rows[key]
    if isinstance(rows.get("sso_break_glass"), str) and rows["sso_break_glass"]:
        doc["sso_break_glass"] = rows["sso_break_glass"][:63]
    names = rows.get("allowed_env")
    if isinstance(names, list):
        doc["allowed_env"] = [n for n in names if isinstance(n, str) and envpolicy.allowed_env_refusal(n) is None]
    classes = rows.get("priority_classes")
    if isinstance(classes, list) and queueclasses.classes_refusal(classes) is None:
        doc["priority_classes"] = classes
    return ClusterSettings(**doc)


def write(store: Store, values: dict[str, Any], *, by: str, now: float | None = None) -> list[str]:
    """Stores ``values`` (already validated); returns the keys whose value changed, sorted."""
    now = time.time() if now is None else now
    changed: list[str] = []
    with store._tx() as s:
        for key, value in sorted(values.items()):
            row = s.get(ClusterSettingRow, key)
            if row is None:
                if value == ClusterSettings.model_fields[key].get_default(call_default_factory=True):
                    continue  # the default written out changes nothing
                s.add(ClusterSettingRow(key=key, value=value, updated_at=now, updated_by=by))
                changed.append(key)
            elif row.value != value:
                row.value, row.updated_at, row.updated_by = value, now, by
                changed.append(key)
    return changed
