"""An agent's upgrade to another llmgw release (issue 29, `llmgw node upgrade`): what is asked, what is said back,
and the one check of the version asked for.

The version goes into a pip requirement (``llmgw==V``) and into a path (``STATE_DIR/llmgw/V/``), so it is
checked here, in one place, by both ends: a PEP 440 *public* version in its normal form (``0.2.1``,
``1.0.0rc1``, ``0.2.0.post1``, ``0.3.0.dev2``), at most 64 characters. Nothing else passes: no local part
(``+abc``), no separators, no spaces, no ``..``, no requirement operators, no leading ``v``.

Pure: standard library only.
"""

from __future__ import annotations

import dataclasses
import enum
import re

MAX_LEN = 64
_N = r"(?:0|[1-9][0-9]*)"
_PUBLIC = re.compile(rf"(?:(?P<epoch>[1-9][0-9]*)!)?(?P<release>{_N}(?:\.{_N})*)"
                     rf"(?:(?P<pre>a|b|rc)(?P<pre_n>{_N}))?(?:\.post(?P<post>{_N}))?(?:\.dev(?P<dev>{_N}))?")
_PRE = {"a": 0, "b": 1, "rc": 2}


def version_problem(version: str) -> str:
    """Why ``version`` is not a version an agent may be upgraded to ("" when it is one)."""
    if not version:
        return "no version given; name the llmgw release to run, e.g. --version 0.2.1"
    if len(version) > MAX_LEN or not _PUBLIC.fullmatch(version):
        return (f"version {version[:MAX_LEN]!r} is not a release such as 0.2.1 (a PEP 440 public version in normal "
                "form: digits and dots, with an optional a/b/rc, .postN or .devN); give the exact version to run")
    return ""


def release_key(version: str) -> tuple[object, ...]:
    """A key that orders releases as PEP 440 does (1.0.dev1 < 1.0a1 < 1.0rc1 < 1.0 < 1.0.post1), for versions that
    pass ``version_problem``; ValueError for any other."""
    m = _PUBLIC.fullmatch(version)
    if m is None or len(version) > MAX_LEN:
        raise ValueError(f"not a release: {version[:MAX_LEN]!r}")
    release = [int(p) for p in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    if m["pre"]:
        pre: tuple[int, ...] = (0, _PRE[m["pre"]], int(m["pre_n"]))
    elif m["dev"] is not None and m["post"] is None:
        pre = (-1,)  # 1.0.dev1 comes before 1.0a1
    else:
        pre = (1,)
    post = (int(m["post"]),) if m["post"] is not None else (-1,)
    dev = (0, int(m["dev"])) if m["dev"] is not None else (1, 0)
    return (int(m["epoch"] or 0), tuple(release), pre, post, dev)


class State(enum.Enum):
    INSTALLING = "installing"
    RESTARTING = "restarting"
    FAILED = "failed"


@dataclasses.dataclass(frozen=True, slots=True)
class UpgradeRequest:
    """The control plane's ``UpgradeAgent``: run llmgw ``version``, installed from ``index_url``."""

    id: str
    version: str
    index_url: str
    find_links: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class UpgradeStatus:
    """The agent's ``UpgradeStatus``: how attempt ``id`` goes (``message``: the step, or why it failed)."""

    id: str
    version: str
    state: State
    message: str = ""
    last_output: tuple[str, ...] = ()
