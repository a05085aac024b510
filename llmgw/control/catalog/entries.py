"""The catalog file: the models a deployment starts from, shipped (``models.yaml`` here) or the operator's own.

Read once at the server's start (``llmgw server --catalog FILE``); a file that does not parse, or an entry
without a name or with a source llmgw cannot fetch, stops the start with the entry and the field, as a bad
setting does, rather than showing a catalog that fails when picked.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from llmgw.core import engines, sources
from llmgw.core.errors import LlmgwError

SHIPPED = Path(__file__).with_name("models.yaml")
#: A catalog is a short list for people; a bigger file is not one.
MAX_ENTRIES = 1000
_FIELDS = ("name", "source", "size", "license", "engine", "description")


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    name: str
    source: str
    size: str = ""
    license: str = ""
    engine: str = ""
    description: str = ""


def load(path: Path | None = None) -> tuple[Entry, ...]:
    """The entries of ``path`` (None: the shipped catalog); LlmgwError naming the file, entry and field."""
    path = path or SHIPPED
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise LlmgwError(f"--catalog {path}: cannot read it: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise LlmgwError(f"--catalog {path}: not valid YAML: {getattr(e, 'problem', None) or e}") from None
    return parse(doc, str(path))


def parse(doc: Any, where: str = "the catalog") -> tuple[Entry, ...]:
    items = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(items, list) or len(items) > MAX_ENTRIES:
        raise LlmgwError(f"{where}: expected a mapping with `models:`, a list of at most {MAX_ENTRIES} entries "
                         "(see llmgw/control/catalog/models.yaml)")
    out: list[Entry] = []
    for i, item in enumerate(items):
        at = f"{where}: models[{i}]"
        if not isinstance(item, dict):
            raise LlmgwError(f"{at}: expected a mapping of {', '.join(_FIELDS)}")
        unknown = sorted(set(item) - set(_FIELDS))
        if unknown:
            raise LlmgwError(f"{at}: unknown field {unknown[0]!r}; an entry has {', '.join(_FIELDS)}")
        fields = {k: str(v) for k, v in item.items() if v is not None}
        if not fields.get("name") or not fields.get("source"):
            raise LlmgwError(f"{at}: name and source are required")
        try:
            sources.parse(fields["source"])
        except ValueError as e:
            raise LlmgwError(f"{at}.source: {e}") from None
        if fields.get("engine") and fields["engine"] not in engines.KNOWN_ENGINES:
            raise LlmgwError(f"{at}.engine: no engine {fields['engine']!r}; one of "
                             f"{', '.join(engines.KNOWN_ENGINES)}")
        out.append(Entry(**fields))
    return tuple(out)
