"""The listen addresses against the system: is each one free for this fleet, at start and at reload?

``sentin8.config`` has already refused two listeners on one address; what is left needs the kernel. The
probe binds without SO_REUSEPORT (then lets go), so it fails while anyone listens there, another fleet or
another program with SO_REUSEPORT included: the workers' own SO_REUSEPORT bind would succeed beside it and
silently share its traffic.
"""

from __future__ import annotations

import errno
import socket

import psutil

from sentin8.config import Config, listen_addresses, parse_hostport
from sentin8.eventlog import event


def probe_exclusive(address: str, key: str) -> None:
    """Bind ``address`` without SO_REUSEPORT (then let go): fails with EADDRINUSE while anyone listens there,
    a fleet with SO_REUSEPORT included."""
    host, port = parse_hostport(address, key)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # our own TIME_WAIT leftovers are fine
        sock.bind((host, port))


def port_holder(address: str, key: str) -> str:
    """`` by pid N (title), child of pid M (title)`` for the process listening on the port, or ``""``."""
    _host, port = parse_hostport(address, key)
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return ""
    pids = sorted(
        {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid}
    )
    if not pids:
        return ""

    def title(pid: int) -> str:
        try:
            return " ".join(psutil.Process(pid).cmdline()) or psutil.Process(pid).name()
        except psutil.Error:
            return "?"

    pid = pids[0]
    text = f" by pid {pid} ({title(pid)})"
    try:
        parent = psutil.Process(pid).ppid()
    except psutil.Error:
        parent = 0
    if parent > 1 and "sentin8-proxy" in title(parent):
        text += f", child of pid {parent} ({title(parent)})"
    return text


def check_at_start(cfg: Config, beside: bool) -> str | None:
    """The first listener (not the management port: the supervisor binds it for good) this fleet cannot
    have to itself, as one ``listen.X: reason`` line. ``beside``: the deliberate second fleet of an upgrade
    shares the ports of the fleet already on them."""
    from workers.listener import bind_reuseport

    for key, address in listen_addresses(cfg):
        if key == "listen.mgmt":
            continue
        try:
            probe_exclusive(address, key)
            continue
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                return f"{key}: cannot listen on {address}: {exc.strerror}"
        holder = port_holder(address, key)
        if not beside:
            return f"{key}: cannot listen on {address}: already in use{holder}" + (
                " (to upgrade, start beside it with --beside-running-fleet)" if "sentin8-proxy" in holder else ""
            )
        try:
            bind_reuseport(address, key).close()
        except OSError as exc:
            return f"{key}: cannot listen beside the running fleet on {address}: {exc.strerror}{holder}"
        event("beside_running_fleet", key=key, listen=address, holder=holder.strip(" ()by"))
    return None


def check_at_reload(new: Config, running: Config) -> str | None:
    """A reload may keep each listener where it is (the workers hold it) or move it to an address nobody
    holds. Moving onto a taken address is refused like a start would be, and so is moving onto another
    listener of the running fleet (its traffic would mix with this one's while the workers roll over).
    ``listen.mgmt`` applies at the next restart: not checked here."""
    current = {key: parse_hostport(address, key) for key, address in listen_addresses(running)}
    for key, address in listen_addresses(new):
        if key == "listen.mgmt":
            continue
        wanted = parse_hostport(address, key)
        if current.get(key) == wanted:
            continue
        for other_key, other in current.items():
            if other == wanted:
                return f"{key}: {address} is {other_key} of the running fleet: moving a listener there needs a restart"
        try:
            probe_exclusive(address, key)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"{key}: cannot listen on {address}: already in use{port_holder(address, key)}"
            return f"{key}: cannot listen on {address}: {exc.strerror}"
    return None


def enable_migrate_req() -> bool:
    """Ask the kernel to hand a closing SO_REUSEPORT listener's queued connections to its siblings."""
    try:
        with open("/proc/sys/net/ipv4/tcp_migrate_req", "w") as fh:
            fh.write("1")
        return True
    except OSError:
        return False


def bound_address(sock: socket.socket) -> str:
    """The address a listener is bound to (the real port when the config asked for port 0)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
