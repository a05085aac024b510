"""The docs page `make up` prints opens in a browser: no credential, nothing loaded from outside (issue 24)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.testing.system import System


@pytest.fixture
def system(tmp_path: Path) -> Iterator[System]:
    s = System(tmp_path)
    try:
        s.start_server()
        yield s
    finally:
        s.close()


def test_the_docs_page_and_its_document_need_no_credential_and_load_nothing_from_outside(system: System) -> None:
    """GET /api/docs and /api/openapi.json answer 200 to a browser without a token; the page lists the REST
    operations, has no script and links nothing off the server; the calls it lists still answer 401."""
    with httpx.Client(base_url=system.url, timeout=30, trust_env=False) as anon:
        page = anon.get("/api/docs")
        assert page.status_code == 200, page.text
        assert page.headers["content-type"].startswith("text/html")
        assert "script-src" not in page.headers["content-security-policy"]
        assert "default-src 'none'" in page.headers["content-security-policy"]
        body = page.text
        assert "<script" not in body.lower()
        assert re.findall(r"(?:src|href)=\"(?:https?:)?//", body) == []  # no CDN, no other host
        assert "/api/v1/models" in body and "/api/v1/nodes/{node_id}/revoke" in body
        doc = anon.get("/api/openapi.json")
        assert doc.status_code == 200 and "/api/v1/models" in doc.json()["paths"]
        assert anon.get("/api/v1/models").status_code == 401
        assert anon.get("/redoc").status_code == 401  # FastAPI's other CDN page is not served
