"""The Sys domain source: deduction (sans-IO), the declared grants, and loading as the restricted role."""

from __future__ import annotations

import asyncio
import random
import re
import uuid

import psycopg
import pytest

from sentin8.routing import Route
from sentin8.sources import domains as dom
from sentin8.sources.domains import AppRow, EnvRow, OrgRow, PostgresDomains, VerticalRow, deduce_routes
from sentin8.sources.grants import GRANTS, ROLE, SCHEMA, grants_sql
from tests.servers import GRANTS_SQL, PostgresServer, install_sys_schema, postgres_module_server  # noqa: F401

APPS = "apps.example.com"


def uid(n: int) -> str:
    return str(uuid.UUID(int=n))


# One org tree with an inactive row at every level; ids are small ints for readability.
ORGS = [
    OrgRow(uid(1), "acme", "active"),
    OrgRow(uid(2), "gone", "suspended"),  # inactive org: nothing under it routes
    OrgRow(uid(3), "shouty", "Active"),  # "Active" is not "active"
]
ENVS = [
    EnvRow(uid(11), uid(1), "prod", "active"),
    EnvRow(uid(12), uid(1), "old", "archived"),  # inactive env in an active org
    EnvRow(uid(13), uid(2), "prod", "active"),  # active env in an inactive org
    EnvRow(uid(14), uid(3), "prod", "active"),  # active env in a not-quite-active org
    EnvRow(uid(15), uid(99), "orphan", "active"),  # org does not exist
]
APP_ROWS = [
    AppRow(uid(101), uid(11), "shop", "web", ["Shop.Acme.COM", "www.acme.com."], "active"),
    AppRow(uid(102), uid(11), "api", "api", [], "active"),
    AppRow(uid(103), uid(11), "legacy", "web", ["legacy.acme.com"], "deleted"),  # inactive app
    AppRow(uid(104), uid(12), "shop", "web", ["old.acme.com"], "active"),  # active app, inactive env
    AppRow(uid(105), uid(13), "shop", "web", ["gone.example"], "active"),  # inactive org
    AppRow(uid(106), uid(14), "shop", "web", [], "active"),  # org state "Active"
    AppRow(uid(107), uid(15), "shop", "web", [], "active"),  # orphan env
    AppRow(uid(108), uid(99), "shop", "web", [], "active"),  # env does not exist
]
VERTICALS = [
    VerticalRow("auth", "auth-svc", "Auth.Example.com", "active"),
    VerticalRow("billing", "billing-svc", "billing.example.com", "disabled"),
]


def hosts(routes: list[Route]) -> list[str]:
    return [r.hostname for r in routes]


def test_deduction_routes_only_active_rows_under_active_parents() -> None:
    got = deduce_routes(ORGS, ENVS, APP_ROWS, VERTICALS, APPS)
    assert hosts(got.routes) == [
        "api.prod.acme.apps.example.com",
        "auth.example.com",
        "shop.acme.com",
        "shop.prod.acme.apps.example.com",
        "www.acme.com",
    ]
    assert got.skipped == 0 and got.conflicts == 0


def test_deduction_context_of_apps_and_custom_domains() -> None:
    by_host = {r.hostname: r for r in deduce_routes(ORGS, ENVS, APP_ROWS, VERTICALS, APPS).routes}
    expected = Route("shop.prod.acme.apps.example.com", "web", env_id=uid(11), app_id=uid(101), org_id=uid(1))
    assert by_host["shop.prod.acme.apps.example.com"] == expected
    for custom in ("shop.acme.com", "www.acme.com"):  # lower-cased, trailing dot dropped, same context
        assert by_host[custom] == Route(custom, "web", env_id=uid(11), app_id=uid(101), org_id=uid(1))
    assert by_host["api.prod.acme.apps.example.com"].service == "api"


def test_deduction_vertical_service_context_is_the_service_only() -> None:
    by_host = {r.hostname: r for r in deduce_routes([], [], [], VERTICALS, APPS).routes}
    assert by_host == {"auth.example.com": Route("auth.example.com", "auth-svc")}


def test_deduction_accepts_uuid_objects_from_the_driver() -> None:
    org, env, app = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    got = deduce_routes(
        [OrgRow(org, "o", "active")],
        [EnvRow(env, org, "e", "active")],
        [AppRow(app, env, "a", "s", None, "active")],
        [],
        "Apps.Test.",
    )
    assert got.routes == [Route("a.e.o.apps.test", "s", env_id=str(env), app_id=str(app), org_id=str(org))]


def test_deduction_skips_invalid_hostnames_and_counts_them() -> None:
    orgs = [OrgRow(uid(1), "acme", "active")]
    envs = [EnvRow(uid(11), uid(1), "prod", "active")]
    apps = [
        AppRow(uid(101), uid(11), "bad_slug", "web", ["ok.example.com", "", "sp ace.com", "-x.com", None], "active"),
    ]
    verticals = [VerticalRow("v", "svc", "*.wild.example.com", "active"), VerticalRow("w", "svc", "a..b", "active")]
    got = deduce_routes(orgs, envs, apps, verticals, APPS)  # type: ignore[arg-type]
    assert hosts(got.routes) == ["*.wild.example.com", "ok.example.com"]
    assert got.skipped == 6
    assert len(got.notes) == 6


def test_duplicate_hostnames_follow_a_fixed_precedence() -> None:
    orgs = [OrgRow(uid(1), "acme", "active")]
    envs = [EnvRow(uid(11), uid(1), "prod", "active")]
    apps = [
        # claims the generated name of app 102 as a custom domain: the generated name wins
        AppRow(uid(101), uid(11), "shop", "web", ["api.prod.acme.apps.example.com", "dup.example.com"], "active"),
        AppRow(uid(102), uid(11), "api", "api", ["dup.example.com", "auth.example.com"], "active"),
        # names itself twice: not a conflict
        AppRow(
            uid(103),
            uid(11),
            "self",
            "s",
            ["self.prod.acme.apps.example.com", "SELF.prod.acme.apps.example.com"],
            "active",
        ),
    ]
    verticals = [
        VerticalRow("b-auth", "auth2", "auth.example.com", "active"),
        VerticalRow("a-auth", "auth1", "auth.example.com", "active"),
    ]
    got = deduce_routes(orgs, envs, apps, verticals, APPS)
    by_host = {r.hostname: r for r in got.routes}
    assert by_host["api.prod.acme.apps.example.com"].app_id == uid(102)  # generated > custom
    assert by_host["dup.example.com"].app_id == uid(101)  # custom vs custom: smallest app id
    assert by_host["auth.example.com"] == Route("auth.example.com", "auth1")  # vertical > app; smallest name
    assert by_host["self.prod.acme.apps.example.com"].app_id == uid(103)
    assert got.conflicts == 4
    assert any("conflict on dup.example.com" in n for n in got.notes)


def test_deduction_does_not_depend_on_row_order() -> None:
    expected = deduce_routes(ORGS, ENVS, APP_ROWS, VERTICALS, APPS)
    rng = random.Random(7)
    for _ in range(20):
        rows = [list(ORGS), list(ENVS), list(APP_ROWS), list(VERTICALS)]
        for r in rows:
            rng.shuffle(r)
        assert deduce_routes(*rows, APPS) == expected


# ---- grants ----------------------------------------------------------------------------------------------


def test_grants_sql_file_is_generated_from_the_module() -> None:
    assert GRANTS_SQL.read_text() == grants_sql(), "regenerate: python -m sentin8.sources.grants > sql/grants.sql"


def test_grants_declare_exactly_four_select_grants_and_schema_usage() -> None:
    sql = grants_sql()
    assert [g.table for g in GRANTS] == ["sys.orgs", "sys.envs", "sys.app_instances", "sys.vertical_services"]
    assert len(re.findall(r"^GRANT SELECT \(", sql, re.M)) == 4
    assert f"GRANT USAGE ON SCHEMA {SCHEMA} TO {ROLE};" in sql
    assert not re.search(r"\b(INSERT|UPDATE|DELETE|TRUNCATE|ALL)\b", sql.replace("-- ", "").split("\n", 3)[3])


def test_queries_ask_only_for_granted_columns() -> None:
    for query, g in zip((dom.Q_ORGS, dom.Q_ENVS, dom.Q_APPS, dom.Q_VERTICALS), GRANTS, strict=True):
        m = re.fullmatch(r"SELECT (.+) FROM (\S+) WHERE state = 'active'", query)
        assert m, query
        assert tuple(c.strip() for c in m.group(1).split(",")) == g.columns and m.group(2) == g.table


# ---- against a real PostgreSQL, as the restricted role ---------------------------------------------------


def seed(admin_dsn: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.cursor().executemany("INSERT INTO sys.orgs VALUES (%s, %s, %s)", ORGS)
        conn.cursor().executemany("INSERT INTO sys.envs VALUES (%s, %s, %s, %s)", ENVS)
        conn.cursor().executemany(
            "INSERT INTO sys.app_instances VALUES (%s, %s, %s, %s, %s, %s)",
            [a._replace(custom_domains=a.custom_domains or []) for a in APP_ROWS],
        )
        conn.cursor().executemany("INSERT INTO sys.vertical_services VALUES (%s, %s, %s, %s)", VERTICALS)
        conn.execute("INSERT INTO sys.org_secrets VALUES (%s, 'sk-live-123')", (uid(1),))


@pytest.fixture
def platform(postgres_module_server: PostgresServer) -> tuple[PostgresServer, str, str]:  # noqa: F811
    """A fresh database on the module's cluster: (server, admin dsn, proxy-role dsn)."""
    db = f"platform_{uuid.uuid4().hex[:12]}"
    proxy_dsn = install_sys_schema(postgres_module_server, db)
    return postgres_module_server, postgres_module_server.dsn(db=db), proxy_dsn


def test_load_as_the_proxy_role_matches_the_pure_deduction(platform: tuple[PostgresServer, str, str]) -> None:
    _, admin_dsn, proxy_dsn = platform
    seed(admin_dsn)

    async def main() -> None:
        source = PostgresDomains(proxy_dsn, APPS, connect_timeout_s=5)
        try:
            first = await source.load()
            second = await source.load()  # the kept connection is reused
        finally:
            await source.close()
        assert first == second == deduce_routes(ORGS, ENVS, APP_ROWS, VERTICALS, APPS)

    asyncio.run(main())


def test_the_proxy_role_reads_nothing_else(platform: tuple[PostgresServer, str, str]) -> None:
    _, admin_dsn, proxy_dsn = platform
    seed(admin_dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        # Sys adds a column later: undeclared, so unreadable, and the source keeps working.
        conn.execute("ALTER TABLE sys.orgs ADD COLUMN billing_email text DEFAULT 'cfo@acme.com'")
        conn.execute("CREATE TABLE public.users (id int, email text)")
    denied = [
        "SELECT * FROM sys.org_secrets",
        "SELECT billing_email FROM sys.orgs",
        "SELECT * FROM sys.orgs",
        "SELECT * FROM public.users",
        "INSERT INTO sys.orgs (id, slug, state) VALUES (gen_random_uuid(), 'x', 'active')",
        "UPDATE sys.app_instances SET state = 'active'",
        "DELETE FROM sys.vertical_services",
    ]
    for sql in denied:
        with psycopg.connect(proxy_dsn, autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(sql)
    with psycopg.connect(proxy_dsn, autocommit=True) as conn:
        assert conn.execute(dom.Q_ORGS).fetchall()

    async def main() -> None:
        source = PostgresDomains(proxy_dsn, APPS)
        try:
            assert len((await source.load()).routes) == 5
        finally:
            await source.close()

    asyncio.run(main())


def test_the_proxy_role_holds_exactly_the_declared_privileges(platform: tuple[PostgresServer, str, str]) -> None:
    _, admin_dsn, _ = platform
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        columns = conn.execute(
            "SELECT table_schema || '.' || table_name, column_name, privilege_type"
            " FROM information_schema.column_privileges WHERE grantee = %s",
            (ROLE,),
        ).fetchall()
        tables = conn.execute(
            "SELECT table_schema || '.' || table_name, privilege_type"
            " FROM information_schema.table_privileges WHERE grantee = %s",
            (ROLE,),
        ).fetchall()
        usage = conn.execute("SELECT has_schema_privilege(%s, 'sys', 'USAGE')", (ROLE,)).fetchone()
    assert tables == []  # no table-wide privilege at all
    assert sorted(columns) == sorted((g.table, c, "SELECT") for g in GRANTS for c in g.columns)
    assert usage == (True,)


def test_load_fails_when_the_server_is_unreachable() -> None:
    async def main() -> None:
        from tests.servers import free_port

        source = PostgresDomains(f"postgresql://{ROLE}@127.0.0.1:{free_port()}/platform", APPS, connect_timeout_s=2)
        with pytest.raises(psycopg.OperationalError):
            await source.load()
        await source.close()

    asyncio.run(main())
