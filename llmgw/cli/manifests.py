"""Reading model files: YAML (one or more documents) into validated models, errors naming file and field."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from llmgw.core import specs
from llmgw.core.errors import LlmgwError, SpecError


def load(path: str) -> list[specs.Model]:
    """Every model in ``path`` (``-`` for standard input); nothing is applied if any is invalid."""
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
    models = []
    for i, doc in enumerate(docs, 1):
        try:
            models.append(specs.parse_manifest(doc))
        except SpecError as e:
            which = f" (document {i})" if len(docs) > 1 else ""
            raise LlmgwError(f"{name}{which}: {e}") from None
    return models
