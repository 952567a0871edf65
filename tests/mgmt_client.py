"""A management-API client for tests: tokens minted (or deliberately broken) with PyJWT, plain HTTP calls."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from typing import Any

import jwt

AUD, ISS = "sentin8-proxy", "sentin8-auth"  # the config defaults
ALL = "proxy:backends:read proxy:mappings:read proxy:stats:read policy-admin"


def claims(scope: str = ALL, **over: Any) -> dict[str, Any]:
    now = int(time.time())
    out: dict[str, Any] = {"iss": ISS, "aud": AUD, "sub": "tester", "iat": now, "exp": now + 300,
                           "jti": uuid.uuid4().hex, "scope": scope}
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = value
    return out


def token(secret: str, scope: str = ALL, alg: str = "HS256", **over: Any) -> str:
    return jwt.encode(claims(scope, **over), secret.encode(), algorithm=alg)


def call(base: str, method: str, path: str, tok: str | None = None, body: Any = None,
         timeout: float = 5.0) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method)
    if tok is not None:
        req.add_header("Authorization", f"Bearer {tok}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def get_json(base: str, path: str, tok: str | None = None) -> tuple[int, Any]:
    status, _, body = call(base, "GET", path, tok)
    return status, json.loads(body)
