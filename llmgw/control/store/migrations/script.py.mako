"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
"""

from alembic import op
import sqlalchemy as sa
${imports if imports else ""}

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = None
depends_on = None
#: The oldest migration head a release may have and run on this schema (``schemafloor``): the floor of the
#: migration before for an expanding one (a table, a nullable or defaulted column, an index); this revision for
#: a contracting one (a drop, a rename, NOT NULL without a default, a type), which may drop only what the release
#: before no longer uses. Left None, tests/unit/test_migration_floors.py fails until it is set.
floor = None


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
