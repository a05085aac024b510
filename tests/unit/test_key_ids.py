"""API key ids: 96 random bits, a clash drawn again (not a 500), and ids made before still valid."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from fastapi import FastAPI

from llmgw.control.http import keys as keys_http
from llmgw.control.http.errors import install
from llmgw.control.store.offloop import StoreThread
from llmgw.control.store.store import Store, StoredKey


class _Kicks:
    def __init__(self) -> None:
        self.count = 0

    def kick(self) -> None:
        self.count += 1


def _create(tmp_path: Path, new_id: Callable[[], str], *, before: tuple[StoredKey, ...] = ()) -> list[httpx.Response]:
    """Two key creations through the real keys router over a real store, with ``new_id`` drawing the ids."""
    store = Store.open(tmp_path)
    for key in before:
        store.add_key(key)
    db = StoreThread(store)
    app = FastAPI()
    install(app)
    app.include_router(keys_http.router(db, _Kicks(), new_id=new_id))

    async def drive() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return [await c.post("/api/v1/keys", json={"name": f"team{i}"}) for i in range(2)] + \
                [await c.get("/api/v1/keys")]

    try:
        return asyncio.run(drive())
    finally:
        db.close()
        store.close()


def test_a_new_key_id_carries_96_random_bits() -> None:
    """``key-`` and 24 hex digits, and 2,000 of them all differ (24 bits clashed at even odds by 4,800)."""
    ids = {keys_http.new_key_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(re.fullmatch(r"key-[0-9a-f]{24}", i) for i in ids), sorted(ids)[:3]


def test_a_clashing_id_is_drawn_again_not_a_500(tmp_path: Path) -> None:
    """An id generator that hands out a taken id first: both creations answer 201 with fresh ids."""
    drawn: Iterator[str] = iter(["key-abc123", "key-abc123", "key-" + "1" * 24, "key-abc123", "key-" + "2" * 24])
    first, second, listing = _create(tmp_path, lambda: next(drawn), before=(
        StoredKey("key-abc123", "old", "ab" * 32, created_at=1.0),))
    assert first.status_code == 201 and second.status_code == 201, (first.text, second.text)
    assert (first.json()["id"], second.json()["id"]) == ("key-" + "1" * 24, "key-" + "2" * 24)
    # The key made before, with its old six-digit id, is still there and listed as it was.
    assert [k["id"] for k in listing.json()["items"]] == ["key-abc123", "key-" + "1" * 24, "key-" + "2" * 24]


def test_a_generator_that_only_clashes_is_refused_with_a_sentence(tmp_path: Path) -> None:
    """Five clashes in a row (a broken generator, not chance) is a 503 that says so, never a 500."""
    first, _, listing = _create(tmp_path, lambda: "key-abc123",
                                before=(StoredKey("key-abc123", "old", "ab" * 32, created_at=1.0),))
    assert first.status_code == 503 and "no free key id" in first.json()["error"]["message"], first.text
    assert [k["id"] for k in listing.json()["items"]] == ["key-abc123"]
