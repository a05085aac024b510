"""The budget flags shared by ``llmgw project set-limits`` and ``llmgw key create|update``: one per
``core.quota.KINDS`` kind (``--tokens-per-day N``), 0 removing the limit, a flag not given leaving it.

``with_limit_flags`` adds them to a command's signature (typer reads ``__signature__``) and hands the
command one ``limits`` dict of the kinds given, so the seven flags are written once.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import typer

from llmgw.core import quota

_HELP = {
    "requests_per_minute": "Requests a minute", "tokens_per_minute": "Tokens a minute",
    "requests_per_day": "Requests a UTC day", "tokens_per_day": "Tokens a UTC day",
    "tokens_per_month": "Tokens a UTC month", "spend_per_month": "Spend a UTC month, in the price's currency",
    "concurrent_requests": "Requests at once",
}


def flag(kind: str) -> str:
    return "--" + kind.replace("_", "-")


def with_limit_flags(fn: Callable[..., None]) -> Callable[..., None]:
    """``fn(..., limits: dict[str, int | float])`` gets the kinds given; its own parameters come first."""
    sig = inspect.signature(fn)
    own = [p for p in sig.parameters.values() if p.name != "limits"]
    added = [inspect.Parameter(kind, inspect.Parameter.KEYWORD_ONLY,
                               default=typer.Option(None, flag(kind), min=0, help=f"{_HELP[kind]} [0: no limit]"),
                               annotation=float | None if kind == quota.SPEND_KIND else int | None)
             for kind in quota.KINDS]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        limits = {k: kwargs.pop(k) for k in quota.KINDS if kwargs.get(k) is not None}
        kwargs = {k: v for k, v in kwargs.items() if k not in quota.KINDS}
        fn(*args, limits=limits, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
    return wrapper


def limits_cell(limits: dict[str, Any]) -> str:
    """``tokens_per_day=20000, concurrent_requests=4``; "-" for none."""
    return ", ".join(f"{k}={limits[k]:g}" if isinstance(limits[k], float) else f"{k}={limits[k]}"
                     for k in quota.KINDS if limits.get(k)) or "-"
