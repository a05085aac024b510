"""Routing policies, one file each on the ``base.Policy`` class, registered here by the name a model gives.

A model's ``routing`` (its spec, then the endpoints document) names one of ``REGISTRY``; the
Forwarder builds one instance of each (``create``). ``llmgw.core.specs.ROUTING_POLICIES`` lists
the same names, in the same order (a test holds them equal): the control plane validates specs
without importing the router.

To add a policy: a module here with a ``Policy`` subclass (its ``name``, ``keyed`` if it reads the
request's affinity key, ``pick``, and the hooks it needs), its class in ``_POLICIES``, and its
name in ``specs.ROUTING_POLICIES``.
"""

from __future__ import annotations

from llmgw.router.pick import DEFAULT_ROUTING
from llmgw.router.policies.base import NO_LOAD, Options, Policy, Ticket
from llmgw.router.policies.kv_aware import KvAware
from llmgw.router.policies.least_outstanding import LeastOutstanding
from llmgw.router.policies.prefix_cache import PrefixCache
from llmgw.router.policies.round_robin import RoundRobin
from llmgw.router.policies.session_affinity import SessionAffinity

_POLICIES: tuple[type[Policy], ...] = (PrefixCache, LeastOutstanding, RoundRobin, SessionAffinity, KvAware)

#: Each policy's class by its name.
REGISTRY: dict[str, type[Policy]] = {cls.name: cls for cls in _POLICIES}
#: The policy of a model that names none (``pick.DEFAULT_ROUTING`` says why this one).
DEFAULT = DEFAULT_ROUTING
#: The names of the policies that read the request's affinity key: only for these is the prompt hashed.
KEYED = frozenset(name for name, cls in REGISTRY.items() if cls.keyed)
#: The names of the keyed policies that also read the prompt's token ids.
TOKENED = frozenset(name for name, cls in REGISTRY.items() if cls.reads_tokens)


def create(options: Options = Options()) -> dict[str, Policy]:
    """One instance of every registered policy, by name."""
    return {name: cls(options) for name, cls in REGISTRY.items()}


__all__ = ["DEFAULT", "KEYED", "TOKENED", "NO_LOAD", "REGISTRY", "Options", "Policy", "Ticket", "create",
           "KvAware", "LeastOutstanding", "PrefixCache", "RoundRobin", "SessionAffinity"]
