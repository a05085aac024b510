"""The web UI as tests see it without a browser: httpx acting as one, and the page parsed into a tree."""

from __future__ import annotations

import html.parser
from typing import Any

import httpx

#: Elements with no end tag.
VOID = {"meta", "link", "input", "br", "img", "hr", "source", "wbr", "col", "area", "base", "embed", "track"}


class Node:
    """One element: its tag, attributes, children, and its text (its descendants' included)."""

    def __init__(self, tag: str, attrs: dict[str, str]) -> None:
        self.tag, self.attrs, self.children, self.parts = tag, attrs, list[Node](), list[str]()

    @property
    def text(self) -> str:
        return " ".join("".join(self.parts).split())

    @property
    def raw(self) -> str:
        """The text as it came, whitespace kept (a ``<pre>``'s lines, a ``<textarea>``'s YAML)."""
        return "".join(self.parts)

    def find(self, pred: Any) -> Node | None:
        return next(iter(self.find_all(pred)), None)

    def find_all(self, pred: Any) -> list[Node]:
        found = [self] if pred(self) else []
        for c in self.children:
            found += c.find_all(pred)
        return found

    def by_id(self, id_: str) -> Node | None:
        return self.find(lambda n: n.attrs.get("id") == id_)

    def get(self, id_: str) -> Node:
        """``by_id``, asserting the element is there."""
        found = self.by_id(id_)
        assert found is not None, f"no #{id_}"
        return found

    def links(self) -> list[str]:
        """Every ``<a href>`` below (and at) this element, in page order."""
        return [n.attrs.get("href", "") for n in self.find_all(lambda n: n.tag == "a")]

    def mutating(self) -> int:
        """How many elements carry ``data-mutating`` (controls a viewer must never be offered)."""
        return len(self.find_all(lambda n: "data-mutating" in n.attrs))


class Tree(html.parser.HTMLParser):
    """The page as a tree; each element's text includes its descendants'."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.root = Node("", {})
        self.stack = [self.root]
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        while len(self.stack) > 1 and self.stack.pop().tag != tag:
            pass

    def handle_data(self, data: str) -> None:
        for n in self.stack:
            n.parts.append(data)


def page(resp: httpx.Response) -> Node:
    """An HTML answer as a tree (asserting it is HTML)."""
    assert "text/html" in resp.headers["content-type"], resp.headers
    return Tree(resp.text).root


class Browser:
    """httpx as a browser: no redirects followed, the session cookie kept by hand, Origin sent on POST."""

    def __init__(self, url: str, *, source: str = "") -> None:
        """``source``: the loopback address to connect from (``127.0.0.2``...), so a test's logins come from an
        address of their own (Linux routes all of 127/8 to ``lo``)."""
        self.url = url
        transport = httpx.HTTPTransport(local_address=source) if source else None
        self.client = httpx.Client(base_url=url, timeout=30, trust_env=False, follow_redirects=False,
                                   transport=transport)
        self.cookies: dict[str, str] = {}

    def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = {"accept": "text/html", **kw.pop("headers", {})}
        if method == "POST":
            headers.setdefault("origin", self.url)
            if headers["origin"] is None:  # a test of a POST without one (not a browser's)
                del headers["origin"]
        if self.cookies:
            headers["cookie"] = "; ".join(f"{k}={v}" for k, v in self.cookies.items())
        resp = self.client.request(method, path, headers=headers, **kw)
        # Only the cookies kept here are sent: httpx's own jar would send them too, on ``self.client`` calls made
        # as an anonymous caller (it kept none while the session cookie was Secure on plain HTTP too).
        self.client.cookies.clear()
        for c in resp.headers.get_list("set-cookie"):
            name, _, rest = c.partition("=")
            value = rest.split(";", 1)[0].strip('"')
            if value and "max-age=0" not in c.lower():
                self.cookies[name] = value
            else:
                self.cookies.pop(name, None)
        return resp

    def cookie_header(self) -> dict[str, str]:
        """The headers a browser's own script would send to the API: the session cookie and this origin."""
        return {"origin": self.url, "cookie": "; ".join(f"{k}={v}" for k, v in self.cookies.items())}

    def login(self, username: str, password: str) -> httpx.Response:
        """Posts the login form; the answer as it came (a 303 to the overview when it worked)."""
        return self.request("POST", "/ui/login", data={"username": username, "password": password})

    def log_in(self, username: str, password: str) -> None:
        """``login``, asserting it worked."""
        resp = self.login(username, password)
        assert resp.status_code == 303, resp.text

    def close(self) -> None:
        self.client.close()


def logged_in(url: str, username: str, password: str) -> Browser:
    """A UI client on the server at ``url``, logged in as ``username`` (asserted)."""
    b = Browser(url)
    b.log_in(username, password)
    return b
