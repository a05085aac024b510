"""The declared fabrics this node can carry traffic on, and why the others are not advertised.

Fabrics are declared, not inferred: OpenSM's default subnet prefix is the same
on every fabric, so nothing on the wire says which adapters belong together.
The configuration names them (``[(fabric, [hca, ...])]``) and this module
checks each declaration against the adapters as they are now: a fabric's
usable adapters are the declared ones that exist and have a usable port, and a
fabric with none is left out of what the node advertises.

Loud about what it drops. A fabric silently missing from a registration looks
identical to one never configured, and the operator who typed the adapter name
is the only person who can fix it, so the reason is logged here, on the machine
where both halves are visible, rather than inferred later from a replica that
will not converge. Registration checks loudly; the heartbeat checks quietly and
speaks only when the answer changed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from llmgw.core.inventory import Fabric, Hca

log = logging.getLogger(__name__)
Declared = Sequence[tuple[str, Sequence[str]]]


def _port_problem(hca: Hca) -> str:
    ports = ", ".join(f"port {p.port} {p.state or 'unknown'}" + (f" ({p.phys_state})" if p.phys_state else "")
                      for p in hca.ports)
    return ports or "no ports"


def assess(declared: Declared, hcas: Sequence[Hca]) -> tuple[tuple[Fabric, ...], tuple[str, ...]]:
    """(the fabrics to advertise, one sentence per problem found). Pure: no logging."""
    by_name = {h.name: h for h in hcas}
    merged: dict[str, list[str]] = {}
    for name, adapters in declared:
        # One fabric declared twice is one fabric; an adapter named twice in it is one adapter.
        listed = merged.setdefault(name, [])
        listed.extend(a for a in dict.fromkeys(adapters) if a not in listed)
    problems: list[str] = []
    owners: dict[str, list[str]] = {}
    fabrics: list[Fabric] = []
    for name, adapters in merged.items():
        usable: list[str] = []
        for adapter in adapters:
            owners.setdefault(adapter, []).append(name)
            hca = by_name.get(adapter)
            if hca is None:
                found = ", ".join(sorted(by_name)) or "none"
                problems.append(f"adapter {adapter} declared for fabric {name} does not exist on this node "
                                f"(adapters here: {found})")
            elif not hca.usable:
                problems.append(f"adapter {adapter} declared for fabric {name} has no usable port: "
                                f"{_port_problem(hca)}")
            else:
                usable.append(adapter)
                # NCCL over RoCE needs the RoCE v2 IPv4 GID; without one it picks a
                # link-local GID and cannot reach a peer on another subnet.
                if any(p.usable and p.link_layer == "Ethernet" and p.roce_v2_gid_index < 0 for p in hca.ports):
                    problems.append(f"adapter {adapter} on fabric {name} is RoCE without a RoCE v2 IPv4 GID; "
                                    "give its interface an IPv4 address")
        if usable:
            fabrics.append(Fabric(name=name, hcas=tuple(usable)))
        else:
            problems.append(f"fabric {name} is not advertised: none of its adapters ({', '.join(adapters)}) can "
                            f"carry traffic, so multi-node replicas on fabric {name} will not be placed on this node")
    for adapter, names in owners.items():
        if len(names) > 1:
            problems.append(f"adapter {adapter} is declared in fabrics {', '.join(names)}; an adapter is cabled "
                            "to one fabric, so all but one of those declarations are wrong")
    return tuple(fabrics), tuple(problems)


class FabricChecker:
    """Checks declared fabrics against the adapters; remembers the last answer to stay quiet until it changes."""

    def __init__(self) -> None:
        self._last: tuple[tuple[Fabric, ...], tuple[str, ...]] | None = None

    def check(self, declared: Declared, hcas: Sequence[Hca], *, loud: bool) -> tuple[Fabric, ...]:
        """The fabrics to advertise. ``loud`` logs every problem; otherwise only an answer that changed is logged."""
        answer = assess(declared, hcas)
        # A first check that is quiet still speaks: nobody has said these problems yet.
        first, changed = self._last is None, answer != self._last
        self._last = answer
        fabrics, problems = answer
        if loud or changed:
            for problem in problems:
                log.warning("%s", problem)
        if changed and not first:
            now = "; ".join(f"{f.name}: {', '.join(f.hcas)}" for f in fabrics) or "none"
            log.warning("the fabrics this node can carry traffic on changed; now %s", now)
        return fabrics
