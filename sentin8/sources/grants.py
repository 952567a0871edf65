"""The proxy's declared access to Sys's PostgreSQL: four SELECT grants and USAGE on schema ``sys``, nothing else.

This module is the one list. ``sql/grants.sql`` is generated from it (``python -m sentin8.sources.grants >
sql/grants.sql``; a test fails when the two differ), and the domain source builds its SELECTs from the same
column lists, so the queries can never ask for a column the role was not granted. Grants are per column:
a column Sys adds later (a billing address, a secret) stays unreadable until it is declared here.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEMA = "sys"
ROLE = "sentin8_proxy"


@dataclass(frozen=True)
class TableGrant:
    table: str  # schema-qualified
    columns: tuple[str, ...]


GRANTS: tuple[TableGrant, ...] = (
    TableGrant("sys.orgs", ("id", "slug", "state")),
    TableGrant("sys.envs", ("id", "org_id", "slug", "state")),
    TableGrant("sys.app_instances", ("id", "env_id", "app_slug", "service", "custom_domains", "state")),
    TableGrant("sys.vertical_services", ("name", "service", "hostname", "state")),
)


def grant(table: str) -> TableGrant:
    for g in GRANTS:
        if g.table == table:
            return g
    raise KeyError(table)


def grants_sql(role: str = ROLE) -> str:
    """The SQL a DBA applies (as the owner of schema ``sys``) to give ``role`` exactly the declared access."""
    lines = [
        "-- Generated from sentin8/sources/grants.py: edit that file, then",
        "--   python -m sentin8.sources.grants > sql/grants.sql",
        f"-- The role itself (LOGIN, password or certificate) is created by the DBA: CREATE ROLE {role} LOGIN;",
        f"GRANT USAGE ON SCHEMA {SCHEMA} TO {role};",
    ]
    lines += [f"GRANT SELECT ({', '.join(g.columns)}) ON {g.table} TO {role};" for g in GRANTS]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(grants_sql(), end="")
