"""The model file's scaling parts: how a change rolls over the replicas, and the autoscaler's bounds and targets."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

from llmgw.core import autoscale as autoscale_mod
from llmgw.core import idle as idle_mod
from llmgw.core import units
from llmgw.core.errors import SpecError
from llmgw.core.specfields import check_fields, choice, integer, mapping

MAX_REPLICAS = 1000


@dataclasses.dataclass(frozen=True, slots=True)
class Rollout:
    """How a change to the engine replaces replicas: each bound a count ("1") or a share of replicas ("25%").

    ``max_surge`` replicas may exist beyond ``replicas`` while a roll runs, and
    at most ``max_unavailable`` fewer than ``replicas`` may be Ready. A share
    rounds up for the surge and down for the unavailable, as Kubernetes does,
    and when both come to 0 the surge is 1: a roll that may neither add nor
    remove a replica could never start.
    """

    max_surge: str = "1"
    max_unavailable: str = "0"

    def surge(self, replicas: int) -> int:
        n = _resolve_count(self.max_surge, replicas, round_up=True)
        return 1 if n == 0 and self.unavailable(replicas) == 0 else n

    def unavailable(self, replicas: int) -> int:
        return min(replicas, _resolve_count(self.max_unavailable, replicas, round_up=False))


def _resolve_count(text: str, replicas: int, *, round_up: bool) -> int:
    if not text.endswith("%"):
        return int(text)
    share = int(text[:-1]) * replicas
    return -(-share // 100) if round_up else share // 100


_ROLLOUT_FIELDS = ("max_surge", "max_unavailable")


def count_doc(text: str) -> int | str:
    return text if text.endswith("%") else int(text)


def _rollout_count(value: Any, field: str) -> str:
    text = str(value).strip() if isinstance(value, str | int) and not isinstance(value, bool) else ""
    if re.fullmatch(r"\d{1,4}", text) and int(text) <= MAX_REPLICAS:
        return str(int(text))
    if re.fullmatch(r"\d{1,3}%", text) and int(text[:-1]) <= 100:
        return f"{int(text[:-1])}%"
    raise SpecError(field, f"expected a number of replicas (such as 1) or a share of them (such as \"25%\"), "
                           f"got {value!r}")


def parse_rollout(value: Any) -> Rollout:
    doc = mapping(value, "spec.rollout")
    check_fields(doc, _ROLLOUT_FIELDS, "spec.rollout")
    return Rollout(max_surge=_rollout_count(doc.get("max_surge", 1), "spec.rollout.max_surge"),
                   max_unavailable=_rollout_count(doc.get("max_unavailable", 0), "spec.rollout.max_unavailable"))


_AUTOSCALE_TARGETS = ("queue_per_replica", "ttft_p90_ms", "inflight_per_replica", "tokens_per_s_per_replica")
#: Field in the file -> (attribute, the least it may be in seconds).
_AUTOSCALE_WINDOWS = {"scale_up_after": ("scale_up_after_s", 0.0), "scale_down_after": ("scale_down_after_s", 0.0),
                      "scale_to_zero_after": ("scale_to_zero_after_s", 0.0),
                      "cold_start_timeout": ("cold_start_timeout_s", 1.0)}
_AUTOSCALE_FIELDS = ("min_replicas", "max_replicas", *_AUTOSCALE_TARGETS, *_AUTOSCALE_WINDOWS)
#: A target past any real load: a typo of a few zeros, refused rather than never scaling.
_MAX_TARGET = 1e9


def parse_autoscale(value: Any) -> autoscale_mod.Autoscale:
    """``spec.autoscale``: bounds, at least one target, windows; every refusal names its field."""
    doc = mapping(value, "spec.autoscale")
    check_fields(doc, _AUTOSCALE_FIELDS, "spec.autoscale")
    lo = integer(1 if doc.get("min_replicas") is None else doc["min_replicas"], "spec.autoscale.min_replicas",
                 lo=0, hi=MAX_REPLICAS)
    if doc.get("max_replicas") is None:
        raise SpecError("spec.autoscale.max_replicas", "required: the most replicas the autoscaler may run")
    hi = integer(doc["max_replicas"], "spec.autoscale.max_replicas", lo=1, hi=MAX_REPLICAS)
    if hi < lo:
        raise SpecError("spec.autoscale.max_replicas", f"{hi} is below min_replicas ({lo}); raise max_replicas "
                                                       "or lower min_replicas")
    fields: dict[str, Any] = {}
    for key in _AUTOSCALE_TARGETS:
        if doc.get(key) is None:
            continue
        field, got = f"spec.autoscale.{key}", doc[key]
        if isinstance(got, bool) or not isinstance(got, int | float) or not 0 < got <= _MAX_TARGET:
            raise SpecError(field, f"expected a number above 0 (at most {_MAX_TARGET:g}), got {got!r}")
        fields[key] = float(got)
    if not fields:
        raise SpecError("spec.autoscale", f"needs at least one target: {', '.join(_AUTOSCALE_TARGETS)} "
                                          "(such as queue_per_replica: 2)")
    for key, (attr, least) in _AUTOSCALE_WINDOWS.items():
        if doc.get(key) is None:
            continue
        try:
            seconds = units.parse_duration(doc[key])
        except ValueError as e:
            raise SpecError(f"spec.autoscale.{key}", str(e)) from None
        if not math.isfinite(seconds) or seconds < least:
            raise SpecError(f"spec.autoscale.{key}", f"must be at least {least:g}s, got {doc[key]!r}")
        fields[attr] = seconds
    return autoscale_mod.Autoscale(min_replicas=lo, max_replicas=hi, **fields)


def autoscale_doc(a: autoscale_mod.Autoscale) -> dict[str, Any]:
    """The canonical ``autoscale`` mapping: targets only when set, every window in seconds."""
    doc: dict[str, Any] = {"min_replicas": a.min_replicas, "max_replicas": a.max_replicas}
    for key in _AUTOSCALE_TARGETS:
        if getattr(a, key):
            doc[key] = getattr(a, key)
    for key, (attr, _) in _AUTOSCALE_WINDOWS.items():
        doc[key] = getattr(a, attr)
    return doc


_IDLE_FIELDS = ("after", "action", "level")


def parse_idle(value: Any) -> idle_mod.Idle:
    """``spec.idle``: ``after`` (required, a duration of at least 1s), ``action`` (sleep|stop), ``level`` (1|2)."""
    doc = mapping(value, "spec.idle")
    check_fields(doc, _IDLE_FIELDS, "spec.idle")
    if doc.get("after") is None:
        raise SpecError("spec.idle.after", "required: how long a replica may go without a request (such as 10m)")
    try:
        seconds = units.parse_duration(doc["after"])
    except ValueError as e:
        raise SpecError("spec.idle.after", str(e)) from None
    if not math.isfinite(seconds) or seconds < 1:
        raise SpecError("spec.idle.after", f"must be at least 1s, got {doc['after']!r}")
    action = choice(doc.get("action", "sleep"), "spec.idle.action", idle_mod.ACTIONS)
    level = integer(doc.get("level", 1), "spec.idle.level", lo=1, hi=2)
    if level != 1 and action != "sleep":
        raise SpecError("spec.idle.level", "a sleep level goes with action: sleep; remove level or set action: sleep")
    return idle_mod.Idle(after_s=seconds, action=action, level=level)


def idle_doc(i: idle_mod.Idle) -> dict[str, Any]:
    """The canonical ``idle`` mapping (``after`` in seconds)."""
    return {"after": i.after_s, "action": i.action, "level": i.level}
