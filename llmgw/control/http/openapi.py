"""The REST API's OpenAPI document, and its copy checked into the repository (``docs/openapi.json``).

The copy is there so that a change to the API shows in review as a change to one file: a test
(``tests/unit/test_openapi_document.py``) fails when the API and the copy differ, and says to run
``python -m llmgw.control.http.openapi --write``. ``--check`` exits 1 (with the paths that differ) when
they do. The document is the one ``/api/openapi.json`` serves, written with sorted keys and indented.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from llmgw.control.auth import Auth
from llmgw.control.cluster import Cluster
from llmgw.control.http.api import create_api
from llmgw.control.store.store import Store

#: The checked-in copy, at the repository's root.
CHECKED_IN = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"
REGENERATE = "python -m llmgw.control.http.openapi --write"


def document() -> dict[str, Any]:
    """The document the API serves, from an app over an empty store (the document does not depend on data)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store.open(Path(tmp))
        try:
            return create_api(store, Cluster(store), auth=Auth.insecure()).openapi()
        finally:
            store.close()


def render(doc: dict[str, Any]) -> str:
    """The document as the checked-in file holds it: stable key order, indented, one newline at the end."""
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def differences(current: dict[str, Any], kept: dict[str, Any]) -> list[str]:
    """The paths and schemas that differ between two documents, for the failure's message."""
    def parts(doc: dict[str, Any]) -> dict[str, Any]:
        return {**{f"path {p}": op for p, op in doc.get("paths", {}).items()},
                **{f"schema {s}": v for s, v in doc.get("components", {}).get("schemas", {}).items()}}

    now, was = parts(current), parts(kept)
    out = [name for name in sorted(set(now) | set(was)) if now.get(name) != was.get(name)]
    if not out and current != kept:
        out.append("the document's other parts (info, version)")
    return out


def check(path: Path = CHECKED_IN) -> list[str]:
    """What differs between the API and the checked-in copy ([] when they agree; the whole file when missing)."""
    current = document()
    if not path.exists():
        return [f"{path} is missing"]
    return differences(current, json.loads(path.read_text()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmgw.control.http.openapi", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help=f"write the document to {CHECKED_IN.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the checked-in copy differs from the API")
    parser.add_argument("--path", type=Path, default=CHECKED_IN, help="the copy (default: docs/openapi.json)")
    args = parser.parse_args(argv)
    if args.write:
        args.path.parent.mkdir(parents=True, exist_ok=True)
        args.path.write_text(render(document()))
        return 0
    found = check(args.path)
    for line in found:
        print(line, file=sys.stderr)
    if found:
        print(f"the REST API changed: run `{REGENERATE}` and commit {args.path.name}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
