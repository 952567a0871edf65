"""The Sys domain source (PostgreSQL, read only): four tables -> ``list[Route]``.

``deduce_routes`` is the whole policy and is sans-IO (rows in, routes out). ``PostgresDomains`` only runs the
four SELECTs, in one read-only REPEATABLE READ transaction so the tables are seen at one instant (an env
deleted between two queries must not leave an orphan app routing). Read-only is also what a hot standby allows:
a multi-host DSN (``target_session_attrs=prefer-standby``, ``load_balance_hosts=random``) may land on one, and
``PostgresDomains.standby`` says whether the last load did (``pg_is_in_recovery()``, asked in the same
transaction, so a promoted standby reads as a primary from its next load on).

Deduction: only ``state = 'active'`` (exactly, lower case) routes, and only under active parents.
An active app instance in an active env of an active org answers
``<app_slug>.<env_slug>.<org_slug>.<apps_domain>`` and each of its custom domains, with context
{service, env_id, app_id (= the app instance id), org_id, hostname}; an active vertical service answers its
``hostname`` with context {service}. Hostnames are lower-cased; an invalid one is skipped and counted.

Duplicate hostnames (Sys should prevent them; the proxy must still be deterministic): the claim with the
highest precedence wins and the others are dropped and reported in ``DomainLoad.conflicts``.
Precedence: a vertical service (platform-owned) > an app's generated name (under ``apps_domain``, which Sys
allocates) > a custom domain (tenant-supplied, so the weakest claim); within one kind the smallest key wins
(vertical ``name``, else app instance id, compared as text). The outcome depends on the rows only, never on
their order.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec
import psycopg

from ..routing import Route
from .grants import grant

CHANGED_CHANNEL = "sentin8:sys:domain:changed"
ACTIVE = "active"

_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOSTNAME = re.compile(rf"(\*\.)?({_LABEL}\.)*{_LABEL}")
_MAX_REPORTED = 50  # conflicts/skips kept for status(): bounded however broken the tables are


class OrgRow(NamedTuple):
    id: Any  # uuid.UUID from the driver; str in tests: only str(id) is used
    slug: str
    state: str


class EnvRow(NamedTuple):
    id: Any
    org_id: Any
    slug: str
    state: str


class AppRow(NamedTuple):
    id: Any
    env_id: Any
    app_slug: str
    service: str
    custom_domains: list[str] | None
    state: str


class VerticalRow(NamedTuple):
    name: str
    service: str
    hostname: str
    state: str


@dataclass
class DomainLoad:
    routes: list[Route] = field(default_factory=list)  # sorted by hostname, one per hostname
    skipped: int = 0  # active rows whose hostname is not a valid name
    conflicts: int = 0  # claims dropped because a stronger claim holds the hostname
    notes: list[str] = field(default_factory=list)  # the first few skips and conflicts, for status()

    def note(self, text: str) -> None:
        if len(self.notes) < _MAX_REPORTED:
            self.notes.append(text)


# Claim precedence, lower wins.
_VERTICAL, _GENERATED, _CUSTOM = 0, 1, 2
_KIND = {_VERTICAL: "vertical service", _GENERATED: "app", _CUSTOM: "custom domain of app"}


def normalize_hostname(name: str) -> str | None:
    """Lower case, no trailing dot; None if it is not a hostname (or ``*.`` wildcard)."""
    host = name.lower().rstrip(".")
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        return None
    return host


def deduce_routes(
    orgs: Iterable[OrgRow],
    envs: Iterable[EnvRow],
    apps: Iterable[AppRow],
    verticals: Iterable[VerticalRow],
    apps_domain: str,
) -> DomainLoad:
    out = DomainLoad()
    suffix = apps_domain.lower().strip(".")
    active_orgs = {str(o.id): o.slug for o in orgs if o.state == ACTIVE}
    # env id -> (env slug, org id, org slug), only for active envs of active orgs
    active_envs: dict[str, tuple[str, str, str]] = {}
    for e in envs:
        org_id = str(e.org_id)
        if e.state == ACTIVE and org_id in active_orgs:
            active_envs[str(e.id)] = (e.slug, org_id, active_orgs[org_id])

    claims: list[tuple[str, int, str, Route]] = []  # (hostname, precedence, tie-break key, route)

    def claim(raw: str | None, rank: int, key: str, route_of: Route) -> None:
        host = normalize_hostname(raw) if isinstance(raw, str) else None
        if host is None:
            out.skipped += 1
            out.note(f"skipped {_KIND[rank]} {key}: {raw!r} is not a hostname")
            return
        claims.append((host, rank, key, msgspec.structs.replace(route_of, hostname=host)))

    for a in apps:
        if a.state != ACTIVE:
            continue
        env = active_envs.get(str(a.env_id))
        if env is None:
            continue
        env_slug, org_id, org_slug = env
        app_id = str(a.id)
        base = Route("", a.service, str(a.env_id), app_id, org_id)
        claim(f"{a.app_slug}.{env_slug}.{org_slug}.{suffix}", _GENERATED, app_id, base)
        for custom in a.custom_domains or ():
            claim(custom, _CUSTOM, app_id, base)
    for v in verticals:
        if v.state == ACTIVE:
            claim(v.hostname, _VERTICAL, v.name, Route("", v.service))

    claims.sort(key=lambda c: (c[0], c[1], c[2]))
    winner: Route | None = None
    winner_desc = ""
    for host, rank, key, route in claims:
        if winner is not None and winner.hostname == host:
            if route != winner:  # the same owner naming a host twice is not a conflict
                out.conflicts += 1
                out.note(f"conflict on {host}: kept {winner_desc}, dropped {_KIND[rank]} {key}")
            continue
        winner, winner_desc = route, f"{_KIND[rank]} {key}"
        out.routes.append(route)
    return out


def _select(table: str, where: str = "") -> str:
    # Columns come from the grant list: the query can only ask for what the role was granted.
    cols = ", ".join(grant(table).columns)
    return f"SELECT {cols} FROM {table}{where}"


# Filtering in SQL only saves transfer (dead rows accumulate); deduce_routes re-checks every state.
_ACTIVE_ONLY = " WHERE state = 'active'"
Q_ORGS = _select("sys.orgs", _ACTIVE_ONLY)
Q_ENVS = _select("sys.envs", _ACTIVE_ONLY)
Q_APPS = _select("sys.app_instances", _ACTIVE_ONLY)
Q_VERTICALS = _select("sys.vertical_services", _ACTIVE_ONLY)


class PostgresDomains:
    """Keeps one connection; any failure drops it and the next ``load()`` reconnects (the caller backs off)."""

    def __init__(
        self,
        dsn: str,
        apps_domain: str,
        connect_timeout_s: int = 5,
        statement_timeout_s: float = 10.0,
    ) -> None:
        self.dsn = dsn
        self.apps_domain = apps_domain
        self.connect_timeout_s = max(2, int(connect_timeout_s))  # libpq's floor is 2 s
        self.statement_timeout_ms = int(statement_timeout_s * 1000)
        self._conn: psycopg.AsyncConnection | None = None
        self.standby = False  # the last load was served by a standby in recovery (it may lag the primary)

    async def _connect(self) -> psycopg.AsyncConnection:
        conn = await psycopg.AsyncConnection.connect(
            self.dsn,
            connect_timeout=self.connect_timeout_s,
            application_name="sentin8-proxy",
            options=f"-c statement_timeout={self.statement_timeout_ms}",
        )
        await conn.set_read_only(True)
        await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
        return conn

    async def fetch_rows(
        self,
    ) -> tuple[list[OrgRow], list[EnvRow], list[AppRow], list[VerticalRow]]:
        if self._conn is None or self._conn.closed:
            self._conn = await self._connect()
        conn = self._conn
        try:
            async with conn.transaction(), conn.cursor() as cur:
                await cur.execute("SELECT pg_is_in_recovery()")
                row = await cur.fetchone()
                standby = bool(row and row[0])
                await cur.execute(Q_ORGS)
                orgs = [OrgRow(*r) for r in await cur.fetchall()]
                await cur.execute(Q_ENVS)
                envs = [EnvRow(*r) for r in await cur.fetchall()]
                await cur.execute(Q_APPS)
                apps = [AppRow(*r) for r in await cur.fetchall()]
                await cur.execute(Q_VERTICALS)
                verticals = [VerticalRow(*r) for r in await cur.fetchall()]
        except BaseException:
            # Whatever went wrong (server gone, permission, cancellation), start from a fresh session next time.
            await self.close()
            raise
        self.standby = standby
        return orgs, envs, apps, verticals

    async def load(self) -> DomainLoad:
        orgs, envs, apps, verticals = await self.fetch_rows()
        return deduce_routes(orgs, envs, apps, verticals, self.apps_domain)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            try:
                await conn.close()
            except Exception:  # closing a dead connection can fail; it is being dropped either way
                pass
