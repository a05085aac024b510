"""Reading model files: YAML (one or more documents) into validated models and adapters (``kind: Adapter``),
errors naming file and field."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from llmgw.core import adapterkind, specs
from llmgw.core.errors import LlmgwError, SpecError


def load(path: str) -> list[specs.Model | adapterkind.AdapterManifest]:
    """Every model and adapter in ``path`` (``-`` for standard input); nothing is applied if any is invalid."""
    name = "<stdin>" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as e:
        raise LlmgwError(f"{name}: cannot read it: {e.strerror}") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise LlmgwError(f"{name}:{where}: not valid YAML: {problem}") from None
    if not docs:
        raise LlmgwError(f"{name}: holds no document; see examples/ for a model file")
    models: list[specs.Model | adapterkind.AdapterManifest] = []
    for i, doc in enumerate(docs, 1):
        try:
            models.append(adapterkind.parse(doc) if adapterkind.is_adapter(doc) else specs.parse_manifest(doc))
        except SpecError as e:
            which = f" (document {i})" if len(docs) > 1 else ""
            raise LlmgwError(f"{name}{which}: {e}") from None
    return models


def load_models(path: str) -> list[specs.Model]:
    """Every model in ``path``; an adapter there is refused (where only models are taken)."""
    out = []
    for item in load(path):
        if not isinstance(item, specs.Model):
            raise LlmgwError(f"{path}: adapter/{item.name} is a kind: Adapter; give a model file here, and apply "
                             "the adapter with `llmgw apply -f`")
        out.append(item)
    return out
