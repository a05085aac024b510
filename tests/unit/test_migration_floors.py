"""The migrations' floors (issue 29): every migration declares one, floors rise along the chain and stay at or
below their revision, and a migration that claims to be expand-only contracts nothing (``migrationlint``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llmgw.control.store import migrationlint, schemafloor
from llmgw.control.store.base import MIGRATIONS
from llmgw.testing import migrations, releases


def test_this_releases_migrations_pass_the_lint() -> None:
    assert migrationlint.problems(MIGRATIONS / "versions") == []


def test_every_migration_declares_its_floor_and_the_head_lets_0_1_0_run() -> None:
    """Alembic's own reading of the chain agrees with the lint's: 0001..0016, each with a floor; the head's
    floor is 0015, 0.1.0's head, so the previous release runs on this release's schema."""
    chain = schemafloor.load_chain(MIGRATIONS)
    assert [m.revision for m in chain.migrations] == [f"{i:04d}" for i in range(1, 17)]
    assert all(m.floor is not None for m in chain.migrations)
    assert chain.head == "0016" and chain.floor_of(chain.head) == "0015"


@pytest.mark.parametrize(("body", "what"), [
    (migrations.CONTRACT, "drop_column()"),
    ('op.drop_table("audit")', "drop_table()"),
    ('op.rename_table("audit", "audit_log")', "rename_table()"),
    ('op.alter_column("users", "role", new_column_name="kind")', "alter_column(new_column_name=…)"),
    ('op.alter_column("users", "role", type_=sa.Text)', "alter_column(type_=…)"),
    ('with op.batch_alter_table("autoscale") as b:\n    b.alter_column("above_since", nullable=False)',
     "alter_column(nullable=False)"),
    ('op.add_column("users", sa.Column("team", sa.String(63), nullable=False))',
     "add_column() of a NOT NULL column without a server_default"),
    ('op.execute("ALTER TABLE users DROP COLUMN role")', "execute('ALTER TABLE users DROP COLUMN role')"),
    ('op.execute(sa.text("alter table users rename column role to kind"))', "execute("),
    ('op.execute("ALTER TABLE users ALTER COLUMN role SET NOT NULL")', "execute("),
])
def test_a_contracting_migration_that_claims_expand_only_is_caught(tmp_path: Path, body: str, what: str) -> None:
    location = migrations.newer(tmp_path, body, floor="0015")
    found = migrationlint.problems(location / "versions")
    assert len(found) == 1, found
    assert found[0].startswith("0017_synthetic.py: line ") and what in found[0]
    assert "raise the floor to 0017, or drop it in the next release" in found[0]


def test_the_same_contraction_with_its_floor_raised_passes(tmp_path: Path) -> None:
    location = migrations.newer(tmp_path, migrations.CONTRACT, floor="0017")
    assert migrationlint.problems(location / "versions") == []


def test_expanding_migrations_pass_and_drops_in_downgrade_do_not_count(tmp_path: Path) -> None:
    """EXPAND (a table, a nullable column) and a NOT NULL column with a server default keep the floor; the
    template's downgrade() is not upgrade()'s business."""
    location = migrations.newer(tmp_path, migrations.EXPAND, floor="0015")
    migrations.add(location, "0018", "0017", 'op.add_column("users", sa.Column("team", sa.String(63), '
                   'nullable=False, server_default=""))\nop.create_index("ix_users_role", "users", ["role"])',
                   floor="0015")
    (location / "versions" / "0018_synthetic.py").write_text(
        (location / "versions" / "0018_synthetic.py").read_text().replace(
            "def downgrade() -> None:\n    pass", 'def downgrade() -> None:\n    op.drop_column("users", "team")'))
    assert migrationlint.problems(location / "versions") == []


@pytest.mark.parametrize(("floor", "sentence"), [
    (None, '0017_synthetic.py: declares no floor: add floor = "NNNN"'),
    ("0018", "0017_synthetic.py: floor '0018' is not a revision of the chain"),
    ("0014", "0017_synthetic.py: floor 0014 is below the floor of the migration before it (0015): floors never "
             "go down"),
])
def test_a_missing_or_wrong_floor_is_caught(tmp_path: Path, floor: str | None, sentence: str) -> None:
    location = migrations.newer(tmp_path, migrations.EXPAND, floor="0015")
    migrations.add(location, "0017", "0016", migrations.EXPAND, floor=floor)
    found = migrationlint.problems(location / "versions")
    assert len(found) == 1 and found[0].startswith(sentence), found


def test_a_floor_above_its_own_revision_is_caught(tmp_path: Path) -> None:
    location = migrations.newer(tmp_path, migrations.EXPAND, floor="0018")
    migrations.add(location, "0018", "0017", migrations.EXPAND.replace("future_", "later_"), floor="0018")
    assert migrationlint.problems(location / "versions") == [
        "0017_synthetic.py: floor 0018 is above its own revision 0017"]


def test_the_template_makes_a_migration_the_lint_refuses_until_its_floor_is_set(tmp_path: Path) -> None:
    """``alembic revision`` writes ``floor = None`` from the template, which the lint reads as no floor."""
    template = (MIGRATIONS / "script.py.mako").read_text()
    assert "\nfloor = None\n" in template
    location = migrations.newer(tmp_path, migrations.EXPAND, floor="0015")
    path = location / "versions" / "0017_synthetic.py"
    path.write_text(path.read_text().replace('floor = "0015"', "floor = None"))
    assert [p.split(":")[1] for p in migrationlint.problems(location / "versions")] == [" declares no floor"]


def test_the_previous_release_runs_on_this_releases_schema() -> None:
    """The head's floor is at or below the previous release's head (tests/upgrade/PREVIOUS), so that release
    runs beside this one; one from before the floor (0.1.0: no ``schemafloor``) fails on any revision it does
    not know, so then this release may add no migration at all."""
    repo = Path(__file__).resolve().parents[2]
    commit = releases.previous_commit(repo)
    listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "--name-only", f"{commit}:llmgw/control/store/"
                             "migrations/versions"], capture_output=True, text=True, check=True).stdout.split()
    previous_head = max(name[:4] for name in listed if name.endswith(".py") and name[:4].isdigit())
    chain = schemafloor.load_chain(MIGRATIONS)
    assert chain.position(chain.floor_of(chain.head)) <= chain.position(previous_head)
    knows_floors = subprocess.run(["git", "-C", str(repo), "cat-file", "-e",
                                   f"{commit}:llmgw/control/store/schemafloor.py"], capture_output=True).returncode == 0
    if not knows_floors:
        assert chain.head == previous_head, (
            f"the previous release ({commit[:12]}) predates the schema floor and fails on a revision it does not "
            f"know: this release may add no migration past its head {previous_head}")
