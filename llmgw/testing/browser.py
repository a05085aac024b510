"""A real browser for the UI tests: Debian's Chromium, driven by Playwright's sync API.

Playwright's own browser downloads are not used (nothing outside loopback and the package registries is
reachable): the tests drive ``/usr/bin/chromium`` (the Makefile's ``test`` target installs Debian's
``chromium`` when it is missing) through ``executable_path``. One ``Browser`` owns the Playwright driver
process and the Chromium process; ``chromium()`` closes both whatever happens, so a failing test leaves no
browser behind, and it first saves a screenshot of every page still open, named ``failed-...``, which
is the picture one wants when reading why a UI test failed.

A page that breaks the UI's Content-Security-Policy (an inline script or style the browser refused) fails the
test: Chromium says so on the console ("Refused to execute inline script because it violates the following
Content Security Policy directive"), each page's console is watched, and ``chromium()`` raises
``CspViolation`` at the end of a test that saw one. A refused script is a button that silently does nothing.

Screenshots go to ``$LLMGW_TEST_ARTIFACTS`` or ``<repo>/test-artifacts/ui/`` (gitignored), one folder
per test, one PNG per named step and viewport: ``<artifacts>/<test>/<step>-<width>.png``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator
from pathlib import Path

from playwright import sync_api

CHROMIUM = Path("/usr/bin/chromium")
REPO = Path(__file__).resolve().parents[2]

# Headless on a machine that reaches nothing but loopback. Without the background-networking,
# component-update and sync flags Chromium spends its first seconds trying to fetch field trials,
# components and safe-browsing lists from Google, and each attempt waits for a DNS timeout; without
# --no-sandbox it refuses to start as root (CI runs as root); without --disable-dev-shm-usage a
# container's 64 MiB /dev/shm makes the renderer crash on a large screenshot ("Aw, Snap!" / Target closed).
CHROMIUM_ARGS = (
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--disable-default-apps",
    "--disable-extensions",
    "--disable-breakpad",
    "--disable-domain-reliability",
    "--no-first-run",
    "--no-default-browser-check",
    "--metrics-recording-only",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider,AutofillServerCommunication",
)


@dataclasses.dataclass(frozen=True)
class Viewport:
    """A screen size a page is tested at; ``name`` only labels it in messages."""

    name: str
    width: int
    height: int


DESKTOP = Viewport("desktop", 1280, 800)
PHONE = Viewport("phone", 390, 844)


def artifacts_root() -> Path:
    """Where screenshots go: ``$LLMGW_TEST_ARTIFACTS`` when set (CI collects it), else ``<repo>/test-artifacts/ui``."""
    return Path(os.environ.get("LLMGW_TEST_ARTIFACTS") or REPO / "test-artifacts" / "ui")


def _slug(text: str) -> str:
    """A file name from a test or step name (pytest's node ids hold ``[``, ``/`` and ``:``)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "unnamed"


class MissingChromium(RuntimeError):
    """Chromium is not installed where the tests look for it."""

    def __init__(self, path: Path) -> None:
        super().__init__(f"no Chromium at {path}: the browser tests drive Debian's chromium package; "
                         "run `make test-e2e` as root (it installs it) or `apt-get install chromium`")


class CspViolation(AssertionError):
    """A page broke the Content-Security-Policy: the browser refused a script, a style or a frame."""


class Browser:
    """One headless Chromium and its pages; every page gets its own context (cookies are not shared)."""

    def __init__(self, browser: sync_api.Browser, folder: Path) -> None:
        self._browser = browser
        #: This test's screenshot folder (made on the first screenshot).
        self.folder = folder
        self._pages: list[tuple[sync_api.Page, Viewport]] = []
        #: Every Content-Security-Policy refusal a page's console reported, with the page's address.
        self.csp_violations: list[str] = []

    def _watch(self, page: sync_api.Page) -> None:
        def on_console(msg: sync_api.ConsoleMessage) -> None:
            if "Content Security Policy" in msg.text:
                self.csp_violations.append(f"{page.url}: {msg.text}")
        page.on("console", on_console)

    def page(self, *, viewport: Viewport = DESKTOP, base_url: str | None = None) -> sync_api.Page:
        """A fresh page (in a context of its own) at ``viewport``; relative ``goto`` paths join ``base_url``."""
        context = self._browser.new_context(viewport={"width": viewport.width, "height": viewport.height},
                                            base_url=base_url, is_mobile=viewport.width < 600)
        page = context.new_page()
        self._watch(page)
        self._pages.append((page, viewport))
        return page

    def screenshot(self, page: sync_api.Page, step: str) -> Path:
        """Save a full-page PNG of ``page`` as ``<step>-<width>.png`` in this test's folder; returns its path."""
        width = page.viewport_size["width"] if page.viewport_size else 0
        path = self.folder / f"{_slug(step)}-{width}.png"
        self.folder.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)
        return path

    def screenshot_open_pages(self) -> None:
        """The failure pictures: whatever each open page showed when the test failed (best effort).

        ``chromium()`` takes them when its body raises; a pytest fixture, whose generator is resumed normally
        after a failed test, calls this itself when the test failed.
        """
        for i, (page, _) in enumerate(self._pages):
            if page.is_closed():
                continue
            with contextlib.suppress(sync_api.Error):
                self.screenshot(page, f"failed-{i}")


def log_in(page: sync_api.Page, *, username: str, password: str, lands: bool = True) -> None:
    """Fill and submit ``/ui/login`` as a person does (typing, then the form's own button); with ``lands``, wait
    until the browser is on the overview (a refused login never gets there, so a test of one passes False)."""
    page.goto("/ui/login")
    form = page.locator("#login-form")
    form.locator("[name=username]").fill(username)
    form.locator("[name=password]").fill(password)
    form.get_by_role("button").first.click()
    if lands:
        page.wait_for_url("**/ui/")


@contextlib.contextmanager
def chromium(test: str, *, executable: Path = CHROMIUM, artifacts: Path | None = None) -> Iterator[Browser]:
    """A headless Chromium for test ``test`` (names its screenshot folder), closed whatever happens."""
    if not executable.exists():
        raise MissingChromium(executable)
    folder = (artifacts or artifacts_root()) / _slug(test)
    # Old pictures from an earlier run would pass for this run's: the folder holds this run's only.
    if folder.is_dir():
        for old in folder.glob("*.png"):
            old.unlink()
    with sync_api.sync_playwright() as pw:
        launched = pw.chromium.launch(executable_path=str(executable), headless=True, args=list(CHROMIUM_ARGS))
        browser = Browser(launched, folder)
        try:
            yield browser
            if browser.csp_violations:
                raise CspViolation("the browser refused what the Content-Security-Policy forbids:\n"
                                   + "\n".join(browser.csp_violations[:10]))
        except BaseException:
            browser.screenshot_open_pages()
            raise
        finally:
            launched.close()
