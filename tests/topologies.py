"""Valkey/Redis deployments beyond one server, for the tests of ``sources.valkey_mode`` (docs/hosts.md).

- ``ValkeyCluster``: three masters started with ``--cluster-enabled yes`` on free ports (client and bus port both
  chosen), joined by ``redis-cli --cluster create … --cluster-yes``; ready once every node says ``cluster_state:ok``.
- ``SentinelGroup``: a master, one replica and ``sentinels`` sentinels (``redis-server --sentinel``) monitoring it
  as ``MASTER``; ready once a sentinel knows the replica. ``failover()`` asks a sentinel for ``SENTINEL FAILOVER``
  and returns once every sentinel names the new master.

Both accept ``valkey-server``/``valkey-cli`` where installed, else ``redis-server``/``redis-cli``. Each owns a temp dir
and its processes (SIGKILLed on close), so ``pytest -n auto`` workers never meet.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.sentinel import Sentinel

from tests.peers import free_port, wait_until

MASTER = "s8master"
DEADLINE_S = 30.0


def _binary(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"none of {', '.join(names)} is installed (Debian: redis-server or valkey-server)")


def server_binary() -> str:
    return _binary("valkey-server", "redis-server")


def _ping(port: int) -> bool:
    try:
        with redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=1, socket_timeout=2) as c:
            return bool(c.ping())
    except redis.exceptions.RedisError:
        return False


class _Processes:
    def __init__(self, prefix: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=prefix))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}

    def spawn(self, port: int, args: list[str]) -> None:
        log = self.dir / f"{port}.log"
        self.procs[port] = subprocess.Popen(
            [*args, "--logfile", str(log)], cwd=self.dir, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        wait_until(lambda: _ping(port) or self.procs[port].poll() is not None, DEADLINE_S, what=f"port {port}")
        if self.procs[port].poll() is not None:
            raise RuntimeError(f"{args[0]} on {port} exited:\n{log.read_text(errors='replace')[-2000:]}")

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port, None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(15)

    def close(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.dir, ignore_errors=True)


class ValkeyCluster(_Processes):
    mode = "cluster"

    def __init__(self, masters: int = 3) -> None:
        super().__init__("s8-vcluster-")
        try:
            self._start(masters)
        except BaseException:
            self.close()
            raise

    def _start(self, masters: int) -> None:
        binary = server_binary()
        self.ports = [free_port() for _ in range(masters)]
        for port in self.ports:
            node_dir = self.dir / str(port)
            node_dir.mkdir()
            args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes"]
            args += ["--cluster-port", str(free_port()), "--cluster-config-file", str(node_dir / "nodes.conf")]
            args += ["--cluster-node-timeout", "2000", "--save", "", "--appendonly", "no", "--dir", str(node_dir)]
            self.spawn(port, args)
        cli = _binary("valkey-cli", "redis-cli")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        done = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True,
            timeout=60,
        )
        if done.returncode != 0:
            raise RuntimeError(f"cluster create failed:\n{(done.stdout + done.stderr).decode(errors='replace')}")
        wait_until(self._ok, DEADLINE_S, 0.1, what="cluster_state:ok on every node")

    def _ok(self) -> bool:
        for port in self.ports:
            with redis.Redis(host="127.0.0.1", port=port, socket_timeout=2) as c:
                if c.cluster("info").get("cluster_state") != "ok":
                    return False
        return True

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.ports]

    def sources(self) -> str:
        """The ``[sources]`` keys that reach this cluster."""
        nodes = ", ".join(f'"{n}"' for n in self.nodes)
        return f'valkey_mode = "cluster"\nvalkey_nodes = [{nodes}]\nvalkey_url = "redis://127.0.0.1/0"\n'

    def client(self) -> RedisCluster:
        return RedisCluster(startup_nodes=[ClusterNode("127.0.0.1", p) for p in self.ports], socket_timeout=5)


class SentinelGroup(_Processes):
    mode = "sentinel"

    def __init__(self, sentinels: int = 2) -> None:
        super().__init__("s8-sentinel-")
        try:
            self._start(sentinels)
        except BaseException:
            self.close()
            raise

    def _start(self, sentinels: int) -> None:
        binary = server_binary()
        self.master_port, self.replica_port = free_port(), free_port()
        base = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(self.dir)]
        self.spawn(self.master_port, [binary, "--port", str(self.master_port), *base])
        replica = [binary, "--port", str(self.replica_port), "--replicaof", "127.0.0.1", str(self.master_port)]
        self.spawn(self.replica_port, [*replica, *base])
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        for port in self.sentinel_ports:
            conf = self.dir / f"sentinel-{port}.conf"  # a sentinel rewrites its config: one file each
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.dir}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {self.master_port} 1\n"
                f"sentinel down-after-milliseconds {MASTER} 1000\n"
                f"sentinel failover-timeout {MASTER} 10000\n"
            )
            self.spawn(port, [binary, str(conf), "--sentinel"])
        wait_until(self._replica_known, DEADLINE_S, 0.1, what="the sentinels know the replica")

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=2, decode_responses=True)

    def _replica_known(self) -> bool:
        for port in self.sentinel_ports:
            with self._sentinel(port) as s:
                replicas = s.sentinel_slaves(MASTER)
                if not any(r.get("master-link-status") == "ok" for r in replicas):
                    return False
        return True

    def master_address(self, port: int | None = None) -> tuple[str, int]:
        with self._sentinel(port or self.sentinel_ports[0]) as s:
            host, master_port = s.sentinel_get_master_addr_by_name(MASTER)
            return host, int(master_port)

    def failover(self) -> int:
        """``SENTINEL FAILOVER``; returns the new master's port once every sentinel names it."""
        old = self.master_address()[1]
        with self._sentinel(self.sentinel_ports[0]) as s:
            s.execute_command("SENTINEL", "FAILOVER", MASTER)
        wait_until(
            lambda: all(self.master_address(p)[1] != old for p in self.sentinel_ports),
            DEADLINE_S,
            0.1,
            what="every sentinel names the new master",
        )
        return self.master_address()[1]

    @property
    def nodes(self) -> list[str]:
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def sources(self) -> str:
        nodes = ", ".join(f'"{n}"' for n in self.nodes)
        return (
            f'valkey_mode = "sentinel"\nvalkey_nodes = [{nodes}]\nsentinel_master = "{MASTER}"\n'
            'valkey_url = "redis://127.0.0.1/0"\n'
        )

    def client(self) -> redis.Redis:
        """A client of whoever is master now (asks the sentinels on every new connection)."""
        sentinel = Sentinel([("127.0.0.1", p) for p in self.sentinel_ports], socket_timeout=5)
        return sentinel.master_for(MASTER, socket_timeout=5)


@contextlib.contextmanager
def running(mode: str) -> Iterator[ValkeyCluster | SentinelGroup]:
    group: ValkeyCluster | SentinelGroup = ValkeyCluster() if mode == "cluster" else SentinelGroup()
    try:
        yield group
    finally:
        group.close()


@pytest.fixture(params=["cluster", "sentinel"])
def valkey_group(request) -> Iterator[ValkeyCluster | SentinelGroup]:
    """A 3-master cluster, then a Sentinel-watched master + replica (one test run each)."""
    with running(request.param) as group:
        yield group


@pytest.fixture
def valkey_cluster() -> Iterator[ValkeyCluster]:
    with running("cluster") as group:
        yield group  # type: ignore[misc]


@pytest.fixture
def sentinel_group() -> Iterator[SentinelGroup]:
    with running("sentinel") as group:
        yield group  # type: ignore[misc]
