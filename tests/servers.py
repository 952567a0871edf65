"""Private Valkey/Redis and PostgreSQL servers for integration tests: a pytest plugin.

Enable it with ``pytest_plugins = ["tests.servers"]`` in the root conftest (or import the fixtures).
Every server is private to one fixture instance: its own temp dir, a free port, a unix socket dir inside
the temp dir, so ``pytest -n auto`` workers never meet, and a machine-wide Redis on 6379 or PostgreSQL on
5432 is never touched. Readiness is polled with a deadline (connection attempts), never a fixed sleep.

PostgreSQL refuses to run as root, so when the tests run as root the cluster is created and run as
``nobody`` (``subprocess`` ``user=``/``group=``/``extra_groups=[]``, the temp dir chowned to it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from tests.peers import free_port, wait_until

REPO = Path(__file__).resolve().parent.parent
GRANTS_SQL = REPO / "sql" / "grants.sql"
PROXY_ROLE = "sentin8_proxy"
START_DEADLINE_S = 30.0


def _log_tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


# ---- Valkey / Redis --------------------------------------------------------------------------------------


class RedisServer:
    """``valkey-server`` (preferred) or ``redis-server`` on 127.0.0.1:<free port>, no persistence.

    ``stop()`` and ``start()`` keep the port, to simulate an outage and a recovery of the same endpoint.
    A restart loses the data (nothing is saved), like a fresh Valkey would, unless ``persist=True``: then
    every write is in an fsynced append-only file, so even a SIGKILLed server comes back with its data.
    """

    def __init__(self, workdir: Path, persist: bool = False) -> None:
        binary = shutil.which("valkey-server") or shutil.which("redis-server")
        if binary is None:  # fail, not skip: a green run must not hide a missing install step
            pytest.fail("neither valkey-server nor redis-server is installed (Debian: valkey-server or redis-server)")
        self.binary = binary
        self.dir = workdir
        self.port = free_port()
        self.log = workdir / "redis.log"
        self.persist = persist
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = False  # once up, the port is the endpoint's for good

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=2, socket_timeout=5)

    def _ping(self) -> bool:
        """Ours answers: a server on the port that is another process (another test's, which bound the free
        port first) does not count."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.binary} exited ({self.proc.returncode}):\n{_log_tail(self.log)}")
        try:
            with self.client() as c:
                return self.proc is not None and c.info("server").get("process_id") == self.proc.pid
        except redis.exceptions.RedisError:
            return False

    def start(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        for attempt in range(3):
            aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.persist else ["--appendonly", "no"]
            args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", *aof]
            args += ["--dir", str(self.dir), "--logfile", str(self.log), "--daemonize", "no"]
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
            try:
                wait_until(self._ping, START_DEADLINE_S, what=f"{self.binary} on port {self.port}")
            except RuntimeError:
                # the first start only: a restart keeps its port (an outage and a recovery of one endpoint)
                if self.started or attempt == 2 or "already in use" not in _log_tail(self.log):
                    raise
                self.port = free_port()  # another test bound the free port first
                continue
            self.started = True
            return

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (clean shutdown) or SIGKILL (``kill=True``, a crash); returns once the process is gone."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- PostgreSQL ------------------------------------------------------------------------------------------


def pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if candidates:
        return candidates[-1]  # the newest major version
    pytest.fail(f"PostgreSQL's {name} is not installed (Debian: postgresql)")


class PostgresServer:
    """A throwaway cluster (``initdb`` + ``pg_ctl``) with trust auth on 127.0.0.1:<free port>.

    ``stop()``/``start()`` keep the data directory and the port. Superuser: ``postgres``.
    """

    def __init__(self, workdir: Path, standby_of: PostgresServer | None = None) -> None:
        """``standby_of``: a hot standby of that running server (``pg_basebackup -R``: it streams from it)."""
        self.initdb = pg_bin("initdb")
        self.pg_ctl = pg_bin("pg_ctl")
        self.dir = workdir
        self.data = workdir / "data"
        self.log = workdir / "postgres.log"
        self.port = free_port()
        self.running = False
        self.started = False  # once up, the port is the endpoint's for good
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            # initdb and postgres refuse root: run them as nobody, owning the temp dir.
            nobody = pwd.getpwnam("nobody")
            os.chown(workdir, nobody.pw_uid, nobody.pw_gid)
            self._as = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        if standby_of is not None:
            base = [pg_bin("pg_basebackup"), "-D", str(self.data), "-R", "-X", "stream", "-c", "fast", "--no-sync"]
            self._run([*base, "-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres"])
            return
        self._run([self.initdb, "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync"])

    def _run(self, args: list[str]) -> None:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C", "TZ": "UTC"}
        done = subprocess.run(
            args, cwd=self.dir, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60, **self._as
        )
        if done.returncode != 0:
            out = (done.stdout + done.stderr).decode(errors="replace")
            raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{out}\n{_log_tail(self.log)}")

    def dsn(self, user: str = "postgres", db: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def _accepts(self) -> bool:
        try:
            with psycopg.connect(self.dsn(), connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False

    def start(self) -> None:
        if self.running:
            return
        for attempt in range(3):
            opts = (
                f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
                " -c synchronous_commit=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=50"
            )
            start = [self.pg_ctl, "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60", "start"]
            try:
                self._run(start)
                break
            except RuntimeError:
                # the first start only (a restart keeps its port): another test bound the free port first
                if self.started or attempt == 2 or "already in use" not in _log_tail(self.log, 5):
                    raise
                self.port = free_port()
        self.running = self.started = True
        wait_until(self._accepts, START_DEADLINE_S, what=f"postgres on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        """``fast`` (clean, disconnects clients) or ``immediate`` (a crash)."""
        if not self.running:
            return
        self._run([self.pg_ctl, "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"])
        self.running = False

    def execute(self, sql: str, params: Any = None, db: str = "postgres") -> None:
        with psycopg.connect(self.dsn(db=db), autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql, params)

    def create_database(self, name: str) -> None:
        self.execute(f'CREATE DATABASE "{name}"')


# ---- the Sys schema --------------------------------------------------------------------------------------

SYS_SCHEMA = """
CREATE SCHEMA sys;
CREATE TABLE sys.orgs (id uuid PRIMARY KEY, slug text NOT NULL, state text NOT NULL);
CREATE TABLE sys.envs (id uuid PRIMARY KEY, org_id uuid NOT NULL, slug text NOT NULL, state text NOT NULL);
CREATE TABLE sys.app_instances (
    id uuid PRIMARY KEY, env_id uuid NOT NULL, app_slug text NOT NULL, service text NOT NULL,
    custom_domains text[] NOT NULL DEFAULT '{}', state text NOT NULL
);
CREATE TABLE sys.vertical_services (name text PRIMARY KEY, service text NOT NULL, hostname text NOT NULL,
    state text NOT NULL);
-- Not declared in sentin8/sources/grants.py: the proxy role must not be able to read it.
CREATE TABLE sys.org_secrets (org_id uuid PRIMARY KEY, api_key text NOT NULL);
"""


def install_sys_schema(server: PostgresServer, db: str = "platform") -> str:
    """Create database ``db`` with the four ``sys.*`` tables (plus one undeclared table), a LOGIN role
    ``sentin8_proxy`` and exactly the grants of ``sql/grants.sql``; returns the role's DSN."""
    server.create_database(db)
    with psycopg.connect(server.dsn(db=db), autocommit=True, connect_timeout=5) as conn:
        conn.execute(SYS_SCHEMA)
        # Roles are cluster-wide: a module-scoped cluster may already have it.
        exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (PROXY_ROLE,)).fetchone()
        if not exists:
            conn.execute(f"CREATE ROLE {PROXY_ROLE} LOGIN")
        conn.execute(GRANTS_SQL.read_text())
    return server.dsn(PROXY_ROLE, db)


# ---- fixtures --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _workdir(prefix: str) -> Iterator[Path]:
    # Not pytest's tmp_path: its parents are 0700 root, which an unprivileged postgres cannot traverse.
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def running_redis(persist: bool = False) -> Iterator[RedisServer]:
    with _workdir("s8-redis-") as d:
        server = RedisServer(d, persist=persist)
        server.start()
        try:
            yield server
        finally:
            server.stop(kill=True)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    with _workdir("s8-pg-") as d:
        server = PostgresServer(d)
        server.start()
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                server.stop(mode="immediate")


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    """A private Valkey/Redis for this test only (may be stopped and started)."""
    with running_redis() as server:
        yield server


@pytest.fixture
def postgres_server() -> Iterator[PostgresServer]:
    """A private PostgreSQL cluster for this test only (may be stopped and started)."""
    with running_postgres() as server:
        yield server


@pytest.fixture(scope="module")
def postgres_module_server() -> Iterator[PostgresServer]:
    """One cluster per test module and xdist worker, for tests that only need their own database
    (``install_sys_schema(server, db=unique name)``). Never stop it from a test."""
    with running_postgres() as server:
        yield server
