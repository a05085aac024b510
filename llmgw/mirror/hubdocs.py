"""The mirror's answers in the Hugging Face hub's shapes: a model's info and a revision's tree.

``huggingface_hub`` clients read these fields; what a real hub sends and the mirror has no use for
(downloads, likes, tags) is sent empty.
"""

from __future__ import annotations

import datetime
import hashlib
from typing import Any

from llmgw.mirror import store as store_mod

LFS_POINTER_SIZE = 134   # the size of a git-lfs pointer file for a sha256; the client requires the field


def model_info(repo: str, rev: store_mod.Revision) -> dict[str, Any]:
    """``GET /api/models/ORG/REPO[/revision/REV]``'s answer, as the hub gives it."""
    siblings = [{"rfilename": e.path, "size": e.size, "blobId": e.oid,
                 **({"lfs": {"sha256": e.sha256, "size": e.size, "pointerSize": LFS_POINTER_SIZE}}
                    if e.sha256 else {})} for e in sorted(rev.files.values(), key=lambda e: e.path)]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return {"_id": rev.sha[:24], "id": repo, "modelId": repo, "author": repo.split("/")[0], "sha": rev.sha,
            "lastModified": now, "private": False, "disabled": False, "gated": False, "downloads": 0, "likes": 0,
            "tags": [], "siblings": siblings}


def tree(rev: store_mod.Revision, base: str, *, recursive: bool) -> list[dict[str, Any]] | None:
    """``GET /api/models/ORG/REPO/tree/REV[/PATH]``'s answer: the files and folders under ``base``; None when
    ``base`` names nothing in the revision."""
    prefix = base + "/" if base else ""
    items: list[dict[str, Any]] = []
    folders: set[str] = set()
    for e in sorted(rev.files.values(), key=lambda e: e.path):
        if not e.path.startswith(prefix):
            continue
        rest = e.path[len(prefix):]
        parts = rest.split("/")
        for i in range(1, len(parts) if recursive else min(len(parts), 2)):
            folders.add(prefix + "/".join(parts[:i]))
        if recursive or len(parts) == 1:
            items.append({"type": "file", "oid": e.oid, "size": e.size, "path": e.path,
                          **({"lfs": {"oid": e.sha256, "size": e.size, "pointerSize": LFS_POINTER_SIZE}}
                             if e.sha256 else {})})
    if base and not items and not folders:
        return None
    return items + [{"type": "directory", "oid": hashlib.sha1(f.encode(), usedforsecurity=False).hexdigest(),
                     "size": 0, "path": f} for f in sorted(folders)]
