"""What every manager of the control loop shares: the store and where its calls run, the clock, the
reconcile settings, and whether this control plane leads now.

One object, held by the ``Cluster`` and each manager, so a takeover or a step-down is seen by all of them at
once. Its two helpers are the one place that chooses between the store's thread (``llmgw server``) and an
inline call (unit tests, ``Cluster(store)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from llmgw.control.reconcile import decide
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store

P = ParamSpec("P")
T = TypeVar("T")


def _yes() -> bool:
    return True


def _nothing() -> None:
    return None


def _no_hint() -> tuple[str, tuple[str, ...]]:
    return "", ()


@dataclasses.dataclass(slots=True)
class LoopContext:
    store: Store
    #: Where store calls run in the server (None: inline, on the caller's thread).
    db: StoreThread | None
    clock: Callable[[], float]
    cfg: decide.Config
    #: Asks the loop for a pass now (``Cluster.kick``).
    kick: Callable[[], None]
    #: Whether this control plane leads (``llmgw.control.leader``): only a leader accepts agents, reconciles,
    #: writes and sends commands; a standby only publishes the router's table from the store.
    leading: bool = True
    #: The term it leads at (0: no election); every command carries it, agents refuse older ones.
    term: int = 0
    #: Whether the lease is still fresh enough to act on (``Leadership.valid``); checked before commands go out.
    may_act: Callable[[], bool] = _yes
    #: Called when the store refused a write as fenced (``Leadership.kick``: check the lease now).
    on_fenced: Callable[[], None] = _nothing
    #: For a standby's refusal of an agent: (the leader's agent address or "", every control plane's).
    hint: Callable[[], tuple[str, tuple[str, ...]]] = _no_hint

    def write(self, method: Callable[Concatenate[Store, P], object], /, *args: P.args, **kwargs: P.kwargs) -> None:
        """A store write nobody waits on: queued on the store's thread (in order), or inline without one."""
        if self.db is None:
            method(self.store, *args, **kwargs)
        else:
            self.db.submit(method, self.store, *args, **kwargs)

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` awaited on the store's thread, or inline without one."""
        if self.db is None:
            return fn(*args, **kwargs)
        return await self.db.call(fn, *args, **kwargs)


class InContext(Generic[T]):
    """An attribute of its owner that is the owner's ``ctx``'s, read and set there.

    So ``cluster.leading`` and ``cluster.may_act = lease.valid`` read and set what every manager sees.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, obj: Any, owner: type | None = None) -> T:
        return getattr(obj.ctx, self._name)  # type: ignore[no-any-return]

    def __set__(self, obj: Any, value: T) -> None:
        setattr(obj.ctx, self._name, value)
