"""The management commands of ``sentin8-proxy``: status | backends | mappings | policy | token.

They talk to the management API like any client (plain HTTP on ``listen.mgmt``) with the bearer token from
``SENTIN8_MGMT_TOKEN``. On the box itself, where the signing secret is in the environment, a command that has
no token mints a short-lived one for itself; ``token`` mints one for an operator.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from sentin8.config import Config, ConfigError, load_file
from sentin8.mgmt import credentials

TOKEN_ENV = "SENTIN8_MGMT_TOKEN"
URL_ENV = "SENTIN8_MGMT_URL"
SELF_TOKEN_TTL_S = 60
COMMANDS = ("status", "backends", "mappings", "policy", "token")


class CliError(Exception):
    """One line for the operator, exit 1."""


def add_parsers(sub: argparse._SubParsersAction) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", help="read listen.mgmt and [mgmt] from this config file")
    common.add_argument("--url", help=f"management API base URL (default: ${URL_ENV}, the config's listen.mgmt,"
                                      " or http://127.0.0.1:9180)")
    common.add_argument("--json", action="store_true", help="print the API's JSON as is")
    sub.add_parser("status", parents=[common], help="fleet health (no token needed)")
    sub.add_parser("backends", parents=[common], help="instances per service: state, freshness, suspect marks")
    p = sub.add_parser("mappings", parents=[common], help="hostname mappings")
    p.add_argument("--host", help="hostnames containing this text")
    p.add_argument("--service")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--offset", type=int, default=0)
    p = sub.add_parser("policy", parents=[common], help="show or change the runtime policy")
    p.add_argument("--set", nargs="+", metavar="KEY=VALUE", default=[],
                   help="waf, rate_limit, rate_limit_rps, rate_limit_burst, rate_limit_key; VALUE 'default' = the"
                        " config file's value")
    p.add_argument("--reset", action="store_true", help="back to the config file's values")
    p = sub.add_parser("token", parents=[common], help="mint a token from the local secret (operators on the box)")
    scopes = ", ".join(credentials.ALL_SCOPES)
    p.add_argument("--scope", action="append", default=[], help=f"repeatable; one of {scopes}")
    p.add_argument("--ttl", type=float, default=3600, help="seconds (default 3600)")
    p.add_argument("--sub", default=os.environ.get("USER") or "operator", help="who the token speaks for")


def _config(args: argparse.Namespace) -> Config:
    if not args.config:
        return Config()
    try:
        return load_file(args.config)
    except ConfigError as exc:
        raise CliError(f"config error: {exc}") from None


def _base_url(args: argparse.Namespace, cfg: Config) -> str:
    if args.url:
        return args.url.rstrip("/")
    if os.environ.get(URL_ENV):
        return os.environ[URL_ENV].rstrip("/")
    listen = cfg.listen.mgmt or "127.0.0.1:9180"
    host, _, port = listen.rpartition(":")
    if host in ("0.0.0.0", "[::]"):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def _token(cfg: Config, scope: str) -> str:
    token = os.environ.get(TOKEN_ENV)
    if token:
        return token
    try:
        secret = credentials.load_secret(cfg.mgmt, os.environ)
    except ConfigError:
        raise CliError(f"no token: set {TOKEN_ENV} (sentin8-proxy token --scope {scope})") from None
    return _mint(secret, cfg, [scope], SELF_TOKEN_TTL_S, sub=os.environ.get("USER") or "operator")


def _mint(secret: bytes, cfg: Config, scopes: list[str], ttl_s: float, sub: str) -> str:
    # PyJWT is imported here only: this module is imported for every command, ``run`` too, whose supervisor
    # forks the workers, and they never handle a token.
    from sentin8.mgmt.auth import mint

    return mint(secret, cfg.mgmt, scopes, ttl_s, sub=sub)


def _call(base: str, method: str, path: str, token: str | None = None, body: Any = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            payload = json.loads(exc.read() or b"null")
        except ValueError:
            payload = None
        return exc.code, payload
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CliError(f"cannot reach the management API at {base}: {reason}") from None


def _check(status: int, body: Any) -> Any:
    if status in (401, 403):
        reason = body.get("reason") if isinstance(body, dict) else ""
        if reason == "replay":
            raise CliError(f"refused: this token was already used for a change; each change needs a fresh one"
                           f" (unset {TOKEN_ENV} on the box to have one minted per command)")
        raise CliError(f"refused ({status} {reason}): a token with the right scope is needed")
    if status == 422:
        raise CliError(f"invalid: {body.get('field')}: {body.get('detail')}")
    if status >= 400 and status != 503:
        raise CliError(f"the management API answered {status}")
    return body


def parse_value(text: str) -> Any:
    """``true``/``false`` -> bool, ``default``/``null`` -> None (the config's value), numbers -> float."""
    low = text.strip().lower()
    if low in ("true", "on", "yes"):
        return True
    if low in ("false", "off", "no"):
        return False
    if low in ("default", "null", "none"):
        return None
    try:
        return float(text)
    except ValueError:
        return text


def _print_table(rows: list[list[str]]) -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def run(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except CliError as exc:
        print(f"sentin8-proxy: {exc}", file=sys.stderr)
        return 1


def _run(args: argparse.Namespace) -> int:
    cfg = _config(args)
    if args.command == "token":
        try:
            secret = credentials.load_secret(cfg.mgmt, os.environ)
        except ConfigError as exc:
            raise CliError(str(exc)) from None
        scopes = [s for item in args.scope for s in item.split()] or list(credentials.ALL_SCOPES)
        unknown = [s for s in scopes if s not in credentials.ALL_SCOPES]
        if unknown:
            raise CliError(f"--scope: unknown scope {unknown[0]!r} (known: {', '.join(credentials.ALL_SCOPES)})")
        if not 0 < args.ttl <= 30 * 86400:
            raise CliError("--ttl: must be within 0..2592000 seconds")
        print(_mint(secret, cfg, scopes, args.ttl, sub=args.sub))
        return 0
    base = _base_url(args, cfg)
    if args.command == "status":
        status, body = _call(base, "GET", "/health")
        _check(status, body)
        if args.json:
            print(json.dumps(body, indent=2))
        else:
            age = body["snapshot_age_s"]
            print(f"{body['status']}  version {body['version']}  workers {body['workers']}"
                  f"  in flight {body['active_connections']}")
            print(f"snapshot age {'-' if age is None else f'{age:.1f} s'}{'  STALE' if body['stale'] else ''}"
                  f"  mappings {body['mappings']}  services {body['services']}  instances "
                  + ", ".join(f"{k} {v}" for k, v in body["instances"].items()))
        return 0 if status == 200 else 3
    if args.command == "backends":
        body = _check(*_call(base, "GET", "/backends", _token(cfg, credentials.SCOPE_BACKENDS)))
        if args.json:
            print(json.dumps(body, indent=2))
            return 0
        rows = [["SERVICE", "INSTANCE", "ADDRESS", "STATE", "FRESH", "AGE_S", "SUSPECT_S", "MODE"]]
        for service, insts in body["services"].items():
            for i in insts:
                rows.append([service, i["id"], f"{i['host']}:{i['port']}", i["state"], "yes" if i["fresh"] else "no",
                             "-" if i["health_age_s"] is None else f"{i['health_age_s']:.1f}",
                             "-" if i["suspect"] is None else f"{i['suspect']:.0f}",
                             "bridge" if i["tls"] else "offload"])
        _print_table(rows)
        return 0
    if args.command == "mappings":
        query = {"limit": args.limit, "offset": args.offset}
        if args.host:
            query["host"] = args.host
        if args.service:
            query["service"] = args.service
        path = "/mappings?" + urllib.parse.urlencode(query)
        body = _check(*_call(base, "GET", path, _token(cfg, credentials.SCOPE_MAPPINGS)))
        if args.json:
            print(json.dumps(body, indent=2))
            return 0
        rows = [["HOSTNAME", "SERVICE", "ENV", "APP", "SOURCE"]]
        rows += [[m["hostname"], m["service"], m["env_id"] or "-", m["app_id"] or "-", m["source"]]
                 for m in body["mappings"]]
        _print_table(rows)
        shown = len(body["mappings"])
        print(f"({shown} of {body['total']})", file=sys.stderr)
        return 0
    # policy
    if args.set and args.reset:
        raise CliError("policy: --set and --reset together")
    token = _token(cfg, credentials.SCOPE_POLICY)
    if args.reset:
        body = _check(*_call(base, "DELETE", "/policy", token))
    elif args.set:
        changes = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep:
                raise CliError(f"--set: {item!r} is not KEY=VALUE")
            changes[key.strip()] = parse_value(value)
        body = _check(*_call(base, "PUT", "/policy", token, changes))
    else:
        body = _check(*_call(base, "GET", "/policy", token))
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    rows = [["KEY", "EFFECTIVE", "RUNTIME", "CONFIG"]]
    for key, value in body["effective"].items():
        over = body["overlay"].get(key)
        runtime = "-" if over is None else json.dumps(over)
        rows.append([key, json.dumps(value), runtime, json.dumps(body["config"][key])])
    _print_table(rows)
    return 0
