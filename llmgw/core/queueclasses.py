"""Priority classes and weights (issue 32): which class and share a request is queued under.

The cluster's classes are a list in rank order (the cluster setting ``priority_classes``, default
``interactive, batch``): ``interactive`` (the default class) and ``batch`` (always the last) must be in it,
and an operator may add others above, between or below ``interactive`` (``premium, interactive, bulk, batch``).
A key or a project is given a class and a weight by an operator (``llmgw key update K --priority-class C
--weight W``). A request is queued as (``QueueAs``):

- its class: its key's, else its project's, else ``interactive``; a class the cluster no longer lists counts
  as ``interactive``. The ``X-Llmgw-Priority`` header (``core.priorities.HEADER``) may lower it: a class ranked
  below its own is taken, one ranked above is clamped to its own (silently: a client that always sends
  ``interactive`` still works with a ``batch`` key), a name the cluster does not list is refused (400);
- its flow, who it shares its class with by weight: its project, or the key alone when the key has a weight
  of its own or belongs to the ``default`` project (keys made without a project share nothing);
- its weight: the key's, else its project's, else 1.

Pure: standard library and ``core`` only.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Iterable

from llmgw.core import fairqueue, quota
from llmgw.core.priorities import BATCH, HEADER, INTERACTIVE

DEFAULT_CLASSES: tuple[str, ...] = (INTERACTIVE, BATCH)
MAX_CLASSES = 16
NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
WEIGHT_RANGE = (fairqueue.MIN_WEIGHT, fairqueue.MAX_WEIGHT)


def classes_refusal(names: Iterable[object]) -> str | None:
    """Why ``names`` cannot be the cluster's classes, or None."""
    names = list(names)
    bad = next((n for n in names if not isinstance(n, str) or not NAME.match(n)), None)
    if bad is not None:
        return (f"priority_classes: {bad!r} is not a class name (a lowercase letter, then up to 31 lowercase "
                f"letters, digits or '-'); give the classes highest first, e.g. premium,interactive,batch.")
    if len(names) > MAX_CLASSES:
        return f"priority_classes: {len(names)} classes, more than the {MAX_CLASSES} allowed; merge some."
    if len(set(names)) != len(names):
        return "priority_classes: a class is named twice; name each once, highest first."
    if INTERACTIVE not in names or not names or names[-1] != BATCH:
        return (f"priority_classes: must list {INTERACTIVE!r} (the default class) and end with {BATCH!r} (the "
                f"lowest, which batches run at), e.g. premium,{INTERACTIVE},{BATCH}; got {','.join(names)}.")
    return None


def weight_refusal(weight: object, where: str = "weight") -> str | None:
    """Why ``weight`` is not a weight (0 means "not set": the project's, else 1), or None."""
    if isinstance(weight, bool) or not isinstance(weight, int | float) or not (
            weight == 0 or WEIGHT_RANGE[0] <= weight <= WEIGHT_RANGE[1]):
        return (f"{where}: expected a number from {WEIGHT_RANGE[0]:g} to {WEIGHT_RANGE[1]:g} (a share relative to "
                f"the others in its class; 0 to unset), got {weight!r}.")
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class QueueAs:
    """How one request waits: its class (name and rank, 0 the highest), its flow and the flow's weight."""

    klass: str = INTERACTIVE
    rank: int = 0
    flow: str = ""
    weight: float = 1.0
    #: The project named on ``/metrics`` ("" for a request without a key).
    project: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Classes:
    """The cluster's classes in rank order, and their ranks."""

    names: tuple[str, ...] = DEFAULT_CLASSES

    @property
    def ranks(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def rank(self, name: str) -> int:
        """``name``'s rank; a class the cluster does not list ranks as ``interactive``."""
        ranks = self.ranks
        return ranks.get(name, ranks.get(INTERACTIVE, 0))

    def queue_as(self, *, key_id: str, project: str, key_class: str = "", key_weight: float = 0.0,
                 project_class: str = "", project_weight: float = 0.0) -> QueueAs:
        """A key's ``QueueAs`` (resolved once per table, not per request)."""
        klass = key_class or project_class or INTERACTIVE
        if klass not in self.names:
            klass = INTERACTIVE
        own = bool(key_weight) or project in ("", quota.DEFAULT_PROJECT)
        flow = f"key:{key_id}" if own else f"project:{project}"
        weight = key_weight or project_weight or 1.0
        return QueueAs(klass=klass, rank=self.rank(klass), flow=flow, weight=weight, project=project)

    def lowered(self, queue_as: QueueAs, asked: str) -> QueueAs | str:
        """``queue_as`` with the class a request's header asks for: lower taken, higher clamped; a refusal
        (the sentence) for a name the cluster does not list. Memoized: a batch runner sends the same header on
        every line, and a new ``QueueAs`` a request was a microsecond."""
        return _lowered(self, queue_as, asked)

    def _lowered(self, queue_as: QueueAs, asked: str) -> QueueAs | str:
        asked = asked.strip().lower()
        ranks = self.ranks
        rank = ranks.get(asked)
        if rank is None:
            return (f"{HEADER}: {asked!r} is not a priority class of this cluster; send one of "
                    f"{', '.join(self.names)} ranked at or below your key's class ({queue_as.klass}), or leave "
                    f"the header out.")
        if rank <= queue_as.rank:
            return queue_as  # at or above its own: its own (a client may lower its class, never raise it)
        return dataclasses.replace(queue_as, klass=asked, rank=rank)


# Bounded: keys x classes in practice; a client sending a new string each time only churns its own entries.
_lowered = functools.lru_cache(maxsize=4096)(Classes._lowered)
