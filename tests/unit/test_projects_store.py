"""Projects in the store, the spec and the routers' table (issue 26), on a real SQLite file.

The upgrade from 0013 moves existing keys into ``default`` and they still authenticate; a project with
keys, and ``default``, are not deleted; the table carries projects, prices, nodes and key scopes.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import sqlalchemy as sa

from llmgw.control.auth import principals
from llmgw.control.auth.principals import Principal
from llmgw.control.auth.projectaccess import Access
from llmgw.control.loop.table import build_endpoints_doc
from llmgw.control.store.store import (
    ProjectRefused,
    Store,
    StoredKey,
    StoredUser,
    UnknownProject,
)
from llmgw.core import quota, specs
from llmgw.core.errors import SpecError
from llmgw.router.auth import Authenticator

SECRET = "llmgw-old-secret"


def _manifest(**spec: object) -> dict[str, object]:
    return {"apiVersion": "llmgw/v1", "kind": "Model", "metadata": {"name": "m"}, "spec": {"engine": "sim", **spec}}


def test_a_key_from_0013_lands_in_default_and_still_authenticates(tmp_path: Path) -> None:
    """A database written at 0013 with a key: after the upgrade the key is in `default` and routers accept it."""
    from alembic import command
    from alembic.config import Config

    old = Store(f"sqlite:///{tmp_path / 'llmgw.db'}")
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parents[2] / "llmgw/control/store/migrations"))
    with old.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0013")
        conn.execute(sa.text("insert into api_keys (id, name, sha256, models, rpm, tpm, priority, created_at, "
                             "disabled, last_used_at) values ('key-abc123', 'old', :h, '[]', 5, 0, 0, 1.0, 0, 0)"),
                     {"h": hashlib.sha256(SECRET.encode()).hexdigest()})
    old.close()
    store = Store.open(tmp_path)
    (key,) = store.list_keys()
    assert (key.id, key.project, key.user, key.limits, key.rpm) == ("key-abc123", "default", "", quota.Limits(), 5)
    assert [p.name for p in store.list_projects()] == ["default"] and store.get_project("default").keys == 1
    auth = Authenticator.from_doc(build_endpoints_doc(store, 0.0).auth)
    found = auth.identify(f"Bearer {SECRET}".encode())
    assert getattr(found, "id", None) == "key-abc123" and getattr(found, "project", None) == "default"
    store.close()


def test_projects_members_limits_and_refusals(tmp_path: Path) -> None:
    """Made, listed, members with roles, limits; a project with keys and `default` are refused deletion."""
    store = Store.open(tmp_path)
    for name in ("alice", "bob"):
        store.put_user(StoredUser(name, "viewer", "x", 1.0))
    made = store.create_project("team-a", description="A", created_by="user:admin", now=5.0)
    assert (made.name, made.description, made.members, made.keys) == ("team-a", "A", (), 0)
    with pytest.raises(ProjectRefused, match="exists already"):
        store.create_project("team-a", now=6.0)
    with pytest.raises(quota.BadLimits, match="project name 'Team A'"):
        store.create_project("Team A", now=6.0)
    store.put_member("team-a", "alice", "owner")
    store.put_member("team-a", "bob", "member")
    store.put_member("team-a", "bob", "viewer")  # a role changed, not a second row
    assert store.get_project("team-a").members == (("alice", "owner"), ("bob", "viewer"))
    assert store.project_roles_of("bob") == {"team-a": "viewer"} and store.project_roles_of("carol") == {}
    with pytest.raises(ProjectRefused, match="role 'boss'"):
        store.put_member("team-a", "bob", "boss")
    with pytest.raises(ProjectRefused, match="user 'carol' not found"):
        store.put_member("team-a", "carol", "member")
    with pytest.raises(UnknownProject, match="project 'nope' not found"):
        store.put_member("nope", "bob", "member")

    limits = quota.Limits(tokens_per_day=20_000, concurrent_requests=4)
    assert store.set_project_limits("team-a", limits).limits == limits
    assert store.project_limits() == {"team-a": limits}  # default has none, so it is not listed

    with pytest.raises(UnknownProject):
        store.add_key(StoredKey("key-1", "k", "ab" * 32, created_at=1.0, project="nope"))
    assert store.list_keys() == []  # nothing written
    store.add_key(StoredKey("key-1", "k", "ab" * 32, created_at=1.0, project="team-a", user="bob",
                            limits=quota.Limits(requests_per_day=100)))
    with pytest.raises(ProjectRefused, match="still has 1 key.*delete them.*or move them"):
        store.delete_project("team-a")
    with pytest.raises(ProjectRefused, match="cannot be deleted"):
        store.delete_project("default")
    changed = store.update_key("key-1", rpm=7, limits=quota.Limits(tokens_per_month=9))
    assert changed is not None and (changed.rpm, changed.limits, changed.user) == (7, quota.Limits(tokens_per_month=9),
                                                                                   "bob")
    assert store.remove_member("team-a", "bob") and not store.remove_member("team-a", "bob")
    store.delete_user("alice")  # a deleted user leaves the projects with them
    assert store.get_project("team-a").members == ()
    assert store.delete_key("key-1") and store.delete_project("team-a") and store.get_project("team-a") is None
    assert not store.delete_project("team-a")
    store.close()


def test_the_table_carries_projects_prices_nodes_and_key_scopes(tmp_path: Path) -> None:
    """ModelEntry.projects/.prices from the spec, KeyEntry project/user/limits, AuthDoc.projects with limits only."""
    store = Store.open(tmp_path)
    model = specs.parse_manifest(_manifest(access={"projects": ["team-b"]},
                                           pricing={"input_per_1m": 1, "output_per_1m": 2.5}))
    store.put_model(model)
    store.create_project("team-b", now=1.0)
    store.create_project("team-c", now=1.0)
    store.set_project_limits("team-b", quota.Limits(requests_per_day=100))
    store.add_key(StoredKey("key-1", "k", "ab" * 32, created_at=1.0, project="team-b", user="bob",
                            limits=quota.Limits(tokens_per_day=20_000)))
    doc = build_endpoints_doc(store, 0.0)
    (entry,) = doc.models
    assert entry.projects == ("team-b",) and entry.prices == quota.Prices(1.0, 0.0, 2.5)
    assert entry.embeddings is True  # a sim model embeds, and its entry says so (core.engines.embeds)
    (key,) = doc.auth.keys
    assert (key.project, key.user, key.limits) == ("team-b", "bob", quota.Limits(tokens_per_day=20_000))
    assert [(p.name, p.limits) for p in doc.auth.projects] == [("team-b", quota.Limits(requests_per_day=100))]
    store.close()


def test_spec_access_and_pricing_are_checked_by_field_and_round_trip() -> None:
    """Both read back unchanged from to_manifest; a bad value names its field; neither moves the fingerprint."""
    plain = specs.parse_manifest(_manifest())
    model = specs.parse_manifest(_manifest(access={"projects": ["b", "a", "b"]}, pricing={"output_per_1m": 3}))
    assert model.spec.projects == ("a", "b") and model.spec.prices == quota.Prices(output_per_1m=3.0)
    assert specs.parse_manifest(model.to_manifest()) == model
    assert "access" not in plain.to_manifest()["spec"] and "pricing" not in plain.to_manifest()["spec"]
    assert model.spec.fingerprint() == plain.spec.fingerprint()  # router-side only: no engine restarts
    for spec, field in (({"access": {"projects": ["Team"]}}, "spec.access.projects[0]"),
                        ({"access": {"projects": "a"}}, "spec.access.projects"),
                        ({"access": {"project": ["a"]}}, "spec.access.project"),
                        ({"pricing": {"input_per_1m": "cheap"}}, "spec.pricing.input_per_1m"),
                        ({"pricing": {"output_per_1m": -1}}, "spec.pricing.output_per_1m"),
                        ({"pricing": {"output": 1}}, "spec.pricing.output")):
        with pytest.raises(SpecError) as e:
            specs.parse_manifest(_manifest(**spec))
        assert e.value.field == field, (spec, e.value)


def test_project_access_rules() -> None:
    """Operators everything; an owner its project's keys; a member its own keys; a viewer reads; others nothing."""
    op = Access(Principal("user", "otto", principals.OPERATOR))
    assert op.manager and op.sees_project("x") and op.makes_key("x", "") and op.sees_key("x", "bob")
    assert Access(principals.INSECURE).manager
    bob = Access(Principal("user", "bob", principals.VIEWER), {"a": "owner", "b": "member", "c": "viewer"})
    assert not bob.manager
    assert bob.makes_key("a", "") and bob.makes_key("a", "carol") and bob.sees_key("a", "carol")
    assert bob.makes_key("b", "bob") and not bob.makes_key("b", "carol") and not bob.makes_key("b", "")
    assert bob.sees_key("b", "bob") and not bob.sees_key("b", "carol") and not bob.sees_key("b", "")
    assert bob.sees_project("c") and not bob.makes_key("c", "bob") and not bob.manages_project("c")
    assert not bob.sees_project("d") and not bob.sees_key("d", "bob")
    assert "not a member of project 'd'" in bob.why_not("creating a key", "d")
