"""Who may use a model and what it costs (issue 26): ``spec.access`` and ``spec.pricing``.

``access.projects`` lists the projects whose keys may use the model; empty (the default) opens it
to every project. A key of another project gets 404 ``model_not_found`` from the router, so the
model's existence is not revealed. ``pricing`` is per 1M tokens (``core.quota.Prices``) and turns a
request's tokens into spend. Both are router-side only: changing them never restarts an engine.
"""

from __future__ import annotations

import math
from typing import Any

from llmgw.core import quota
from llmgw.core.errors import SpecError
from llmgw.core.specfields import check_fields, mapping

_ACCESS_FIELDS = ("projects",)
_PRICE_FIELDS = ("input_per_1m", "cached_input_per_1m", "output_per_1m")
MAX_PROJECTS = 1000


def parse_access(value: Any) -> tuple[str, ...]:
    """``spec.access``: the projects the model is open to, sorted and once each; () for every project."""
    if value is None:
        return ()
    doc = mapping(value, "spec.access")
    check_fields(doc, _ACCESS_FIELDS, "spec.access")
    projects = doc.get("projects")
    if projects is None:
        return ()
    if not isinstance(projects, list):
        raise SpecError("spec.access.projects", f"expected a list of project names, got {type(projects).__name__}")
    if len(projects) > MAX_PROJECTS:
        raise SpecError("spec.access.projects", f"at most {MAX_PROJECTS} projects, got {len(projects)}")
    for i, name in enumerate(projects):
        try:
            quota.check_project_name(name)
        except quota.BadLimits as e:
            raise SpecError(f"spec.access.projects[{i}]", str(e)) from None
    return tuple(sorted(set(projects)))


def parse_pricing(value: Any) -> quota.Prices | None:
    """``spec.pricing``: per 1M input, cached input and output tokens; None when not given."""
    if value is None:
        return None
    doc = mapping(value, "spec.pricing")
    check_fields(doc, _PRICE_FIELDS, "spec.pricing")
    for name in _PRICE_FIELDS:
        v = doc.get(name, 0)
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= 10**6:
            raise SpecError(f"spec.pricing.{name}", f"expected a number from 0 to 1000000 (per 1M tokens), "
                                                    f"got {v!r}")
    return quota.Prices(**{name: float(doc.get(name, 0)) for name in _PRICE_FIELDS})

