"""What a source's files say, for the deploy preview: a remote one read through the cluster's hub or mirror, a
path as the nodes reported it.

A path is never opened by the control plane. A preview is asked for over the API, and a path there is whatever
the caller typed: read here, ``/etc/shadow`` or the cluster CA's key would be read with the server's rights, and
its header parser's refusal (or its size) would tell the caller something of it. So a path's facts are what the
agents already reported of the weights in their model directories (``Inventory.weights``, read by each agent
under its own source-root rule): a path no node reports is answered "no node reports weights at PATH", whatever
is there. A remote source is read by ``remotemeta.Reader`` under its network guard (no loopback, link-local or
own address but the cluster's hub and mirror), as placement reads it.
"""

from __future__ import annotations

import dataclasses
import posixpath
import re
from collections.abc import Iterable

from llmgw.control import remotemeta
from llmgw.control.placement.needs import RemoteWeights
from llmgw.control.state import NodeView
from llmgw.core import modelfacts, sources
from llmgw.core.inventory import WeightFile

#: ``ORG/REPO`` or ``ORG/REPO/FILE.gguf`` typed without its scheme: a Hugging Face repository id.
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+(/[\w./-]+\.gguf)?")


class Unusable(ValueError):
    """The source names nothing the preview can read; the message says what to give instead."""


@dataclasses.dataclass(frozen=True, slots=True)
class Facts:
    #: The source as a model file writes it (``hf://org/repo``, ``file:///models/x.gguf``).
    source: str
    weight: WeightFile
    labels: modelfacts.Labels
    #: The files read of, by name, with their sizes ({} for a path: the nodes report its size only).
    files: dict[str, int]
    #: Where the facts came from, in words ("the hub at https://…", "node1's report").
    origin: str


def canonical(text: str) -> sources.Source:
    """The source ``text`` names: a repository id becomes ``hf://``; anything ``spec.source`` takes passes."""
    text = text.strip()
    if _REPO_ID.fullmatch(text) and not text.startswith(("pkg:", "file:")):
        text = f"hf://{text}"
    try:
        src = sources.parse(text)
    except ValueError as e:
        raise Unusable(f"source: {e}; or give a Hugging Face repository id, ORG/REPO") from None
    if src.kind == "pkg":
        raise Unusable(f"source: {src.text} is a Python package on the nodes, which the preview cannot read; "
                       "apply it, or give the .gguf's path in a node's model directory")
    return src


def read(text: str, *, reader: remotemeta.Reader | None, nodes: Iterable[NodeView]) -> Facts:
    """The facts of ``text``, blocking (call it off the loop); ``Unusable`` when they cannot be had."""
    src = canonical(text)
    if src.kind == "file":
        return _reported(src, nodes)
    if reader is None:
        raise Unusable("source: this control plane reads no remote metadata; give a path a node reports")
    found, labels, files = reader.read_facts(src.text)
    if found.weight is None:
        raise Unusable(f"source: cannot read the metadata of {src.text}: {found.problem}")
    origin = reader.mirror_url if src.kind == "mirror" else reader.hub_endpoint if src.kind == "hf" else src.text
    return Facts(src.text, found.weight, labels, files, f"read from {origin}")


def remote_of(facts: Facts) -> dict[str, RemoteWeights]:
    """What the placer is given for the source: the read, so the dry run estimates as a pass would."""
    return {facts.source: RemoteWeights(facts.weight)} if facts.source.startswith(("hf://", "mirror://", "http")) \
        else {}


def _reported(src: sources.Source, nodes: Iterable[NodeView]) -> Facts:
    path = posixpath.normpath(src.path).rstrip("/") or "/"
    holders: list[tuple[str, WeightFile]] = []
    for node in sorted(nodes, key=lambda n: n.id):
        for w in node.inventory.weights:
            if w.path.rstrip("/") == path:
                holders.append((node.id, w))
    if not holders:
        raise Unusable(f"source: no node reports weights at {path}; the control plane never opens a path itself, "
                       "so put the weights under a node's model_dirs (its agent reports what is there) or give "
                       "hf://ORG/REPO or mirror://NAME")
    node_id, weight = holders[0]
    others = f" and {len(holders) - 1} more nodes" if len(holders) > 1 else ""
    return Facts(f"file://{path}", weight, modelfacts.Labels(), {}, f"reported by {node_id}{others}")
