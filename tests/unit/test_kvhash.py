"""``core.kvhash`` against block hashes vLLM's own functions computed (tests/fixtures/vllm_kv/generate.py)."""

from __future__ import annotations

import json
import pathlib

import pytest

from llmgw.core import kvhash

CASES = json.loads((pathlib.Path(__file__).parents[1] / "fixtures/vllm_kv/hashes.json").read_text())


@pytest.mark.parametrize("case", CASES, ids=[f"{c['algo']}-seed{c['pythonhashseed']}" for c in CASES])
def test_block_hashes_match_vllm(case: dict) -> None:
    algo, seed = case["algo"], case["pythonhashseed"]
    assert kvhash.none_hash(algo, seed).hex() == case["none_hash"]
    got = kvhash.block_hashes(case["tokens"], case["block_size"], algo=algo, pythonhashseed=seed)
    assert [h.hex() for h in got] == case["block_hashes"]
    assert [kvhash.external(h) for h in got] == case["external"]
    first = case["tokens"][:case["block_size"]]
    lora = kvhash.block_hashes(first, case["block_size"], algo=algo, pythonhashseed=seed,
                               extra_keys=(("lora", "sql-adapter"),))
    assert lora[0].hex() == case["lora_first_block"]
    salted = kvhash.block_hashes(first, case["block_size"], algo=algo, pythonhashseed=seed,
                                 extra_keys=("tenant-a",))
    assert salted[0].hex() == case["salted_first_block"]


def test_seed_and_algorithm_change_every_hash() -> None:
    tokens = list(range(32))
    plain = kvhash.block_hashes(tokens, 16)
    assert len(plain) == 2
    assert kvhash.block_hashes(tokens, 16, pythonhashseed="0") != plain
    assert kvhash.block_hashes(tokens, 16, algo="sha256_cbor") != plain
    assert kvhash.block_hashes(tokens + [1, 2, 3], 16) == plain  # a partial block is never hashed
    assert kvhash.block_hashes(tokens, 16, limit=1) == plain[:1]


def test_unreproducible_algorithm_is_refused_with_the_flag() -> None:
    with pytest.raises(ValueError, match="--prefix-caching-hash-algo"):
        kvhash.block_hashes([1] * 16, 16, algo="xxhash")
