"""The UI's templates rendered on their own (no server): the node row the overview and the Nodes page share, and
the playground's embeddings tab."""

from __future__ import annotations

from typing import Any

from llmgw.control.ui import common as ui_common
from llmgw.testing.uiclient import Node, Tree

GIB = 1024**3


def node_doc(i: int, **over: Any) -> dict[str, Any]:
    """One entry of GET /api/v1/nodes, as the API writes it."""
    return {"id": f"n{i:04d}", "status": "Ready", "cordoned": False, "draining": False, "cpu_count": 32,
            "memory_available_bytes": 100 * GIB, "memory_total_bytes": 256 * GIB, "shards": 2, "agent_version": "1.2",
            "gpus": [{"index": 0, "name": "H100", "memory_used_bytes": 40 * GIB, "memory_total_bytes": 80 * GIB},
                     {"index": 1, "name": "H100", "memory_used_bytes": 0, "memory_total_bytes": 80 * GIB}],
            "model_dirs": [{"path": "/models", "free_bytes": 500 * GIB, "total_bytes": 1000 * GIB}], **over}


def render(template: str, nodes: list[dict[str, Any]], *, page: int = 1, pages: int = 1) -> Node:
    html = ui_common.templates.get_template(template).render(base="/ui", user="admin", role="admin", title="Nodes",
                                                     nodes={"nodes": nodes, "page": page, "pages": pages,
                                                            "total": 100 * pages})
    return Tree(html).root


def cells(doc: Node, node_id: str) -> dict[str, str]:
    row = doc.find(lambda n: n.tag == "tr" and n.attrs.get("data-node") == node_id)
    assert row is not None, f"no row for {node_id}"
    return {c.attrs.get("class", "").split()[0] if c.attrs.get("class") else str(i): c.text
            for i, c in enumerate(row.find_all(lambda n: n.tag in ("td", "th")))}


def test_overview_and_nodes_page_show_the_same_row_for_a_node() -> None:
    """A cordoned, draining node with one of two GPUs in use reads the same in the overview's fragment and on the
    Nodes page (state, cordoned, GPUs 1/2 with a meter each, disk); the Nodes page adds shards and agent."""
    doc = node_doc(7, status="NotReady", cordoned=True, draining=True)
    overview, page = render("_nodes.html", [doc]), render("nodes.html", [doc])
    o, p = cells(overview, "n0007"), cells(page, "n0007")
    assert o["state"] == p["state"] == "NotReady"
    assert o["cordoned"] == p["cordoned"] == "yes, draining"
    assert o["gpus"] == p["gpus"] == "1/2"
    assert o["disk"] == p["disk"] == "500 GiB of 1000 GiB"  # core.humane: no ".0"
    assert {k: v for k, v in p.items() if k not in ("shards", "agent")} == o
    assert p["shards"] == "2" and p["agent"] == "1.2" and "shards" not in o
    for doc_ in (overview, page):
        meters = doc_.find_all(lambda n: n.tag == "meter")
        assert [m.attrs["value"] for m in meters] == ["50", "0"]


def test_each_table_pages_to_its_own_address() -> None:
    """With three pages of nodes, the overview's page links stay on the overview and the Nodes page's on /ui/nodes."""
    nodes = [node_doc(i) for i in range(3)]
    overview, page = render("_nodes.html", nodes, page=2, pages=3), render("nodes.html", nodes, page=2, pages=3)
    assert overview.find(lambda n: n.tag == "nav" and "pages" in n.attrs.get("class", "")) is not None
    assert [a for a in overview.links() if "page=" in a] == ["/ui/?page=1", "/ui/?page=3"]
    assert [a for a in page.links() if "page=" in a] == ["/ui/nodes?page=1", "/ui/nodes?page=3"]
    assert len(page.find_all(lambda n: n.tag == "tr" and "data-node" in n.attrs)) == 3


def model_item(name: str, engine: str, args: list[str], state: str = "Ready") -> dict[str, Any]:
    """One entry of GET /api/v1/models, as the API writes it (the manifest and its status)."""
    return {"metadata": {"name": name}, "spec": {"engine": engine, "engine_args": args},
            "status": {"state": state, "ready_replicas": 1 if state == "Ready" else 0}}


def test_the_embeddings_tab_lists_the_ready_models_that_embed_or_may() -> None:
    """A llama.cpp model without --embeddings is left out of the tab (its chat stays), one with it is in, vLLM's
    (its weights decide) is in; with Ready models of which none embeds, the tab says what to add."""
    from llmgw.control.ui import playground_page

    items = [model_item("smol", "llamacpp", ["--embeddings", "--pooling", "mean"]),
             model_item("chat-only", "llamacpp", ["--ctx-size", "512"]), model_item("big", "vllm", []),
             model_item("later", "sim", [], state="Pending")]
    assert playground_page.ready_models(items) == ["big", "chat-only", "smol"]
    assert playground_page.embedding_models(items) == ["big", "smol"]

    def page(listed: list[dict[str, Any]]) -> Node:
        html = ui_common.templates.get_template("playground.html").render(
            base="/ui", user="admin", role="admin", title="Playground", api_root="", list_error="",
            models=playground_page.ready_models(listed), embed_models=playground_page.embedding_models(listed))
        return Tree(html).root

    both = page(items)
    select = both.by_id("embed-model")
    assert select is not None and [o.attrs["value"] for o in select.find_all(lambda n: n.tag == "option")] == \
        ["big", "smol"]
    assert both.by_id("no-embed-model") is None
    none = page([items[1]])
    warning, send = none.by_id("no-embed-model"), none.by_id("embed-send")
    assert warning is not None and '"--embeddings"' in warning.text
    assert send is not None and "disabled" in send.attrs


def test_an_agent_at_another_version_than_the_control_plane_is_marked() -> None:
    """The Nodes page's version column shows the agent's version and, when the API says it differs from the control
    plane's (``version_skew``), a skew badge saying so; an agent at the same version has none."""
    page = render("nodes.html", [node_doc(1, agent_version="0.1.0", version_skew=True),
                                 node_doc(2, version_skew=False)])
    assert cells(page, "n0001")["agent"].split() == ["0.1.0", "skew"]
    assert cells(page, "n0002")["agent"] == "1.2"
    badges = page.find_all(lambda n: n.tag == "span" and "skew" in n.attrs.get("class", ""))
    assert len(badges) == 1 and "another llmgw version" in badges[0].attrs["title"]


def test_the_node_page_marks_an_agent_at_another_version() -> None:
    """The node page's state line says the agent's version, with the skew badge when the API says it differs."""
    def agent(**over: Any) -> str:
        doc = node_doc(1, hostname="h", mgmt_addr="127.0.0.1", engines=[], shards=[], shard_states=[], load={}, **over)
        html = ui_common.templates.get_template("_node_live.html").render(
            base="/ui", node_id="n0001", node={"error": "", "doc": doc}, can_mutate=False)
        found = Tree(html).root.find(lambda n: n.attrs.get("id") == "agent-version")
        assert found is not None
        return " ".join(found.text.split())

    assert agent(agent_version="0.1.0", version_skew=True) == "agent 0.1.0 skew"
    assert agent(agent_version="0.2.0", version_skew=False) == "agent 0.2.0"
