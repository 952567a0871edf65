"""The management API: a Starlette app over shared memory, behind the JWT gate (``sentin8.mgmt.auth``).

It only reads shared memory (routing snapshot, counters, suspect marks, fleet state) and writes the runtime
policy overlay; nothing here can slow or stop traffic. Every refusal is counted by reason and logged without
the token.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .. import routing
from ..config import Config
from ..eventlog import event
from ..metrics.prometheus import exposition
from ..metrics.summary import service_stats
from ..runtime_policy import OverlayError
from ..shm.snapshot import SnapshotCache
from ..shm.state import SharedState
from . import credentials, views
from .dashboard import DASHBOARD_HTML
from .openapi import openapi_document
from .policy_admin import NotSaved, PolicyAdmin

if TYPE_CHECKING:
    from .auth import Verifier  # built by the mgmt process (PyJWT), handed in

MAX_BODY_BYTES = 16_384
_QUERY_TOKEN_NAMES = {"access_token", "token", "jwt", "id_token", "bearer"}
_JWT_SHAPE = re.compile(r"^eyJ[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*\.[A-Za-z0-9_-]*$")

try:
    VERSION = metadata.version("sentin8-proxy")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    VERSION = "0+unknown"

Handler = Callable[[Request], Awaitable[Response]]


def _error(status: int, error: str, detail: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail, **extra}, status_code=status)


def _query_has_token(request: Request) -> bool:
    for key, value in request.query_params.multi_items():
        if key.lower() in _QUERY_TOKEN_NAMES or _JWT_SHAPE.match(value):
            return True
    return False


def _int_param(request: Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise OverlayError(name, "must be an integer") from None
    if not low <= value <= high:
        raise OverlayError(name, f"must be within {low}..{high}")
    return value


class MgmtApp:
    """The app's state and handlers; ``starlette()`` builds the ASGI app."""

    def __init__(
        self,
        cfg: Config,
        shared: SharedState,
        verifier: Verifier,
        policy: PolicyAdmin,
        clock: Callable[[], float] = time.time,
        policy_sync: Any = None,
    ) -> None:
        """``policy_sync``: cluster mode's ``PolicySync``, which publishes each change to the other hosts."""
        self.cfg = cfg
        self.shared = shared
        self.verifier = verifier
        self.policy = policy
        self.policy_sync = policy_sync
        self.clock = clock
        self.routes = SnapshotCache(shared.snapshot_reader(), routing.decode)
        self.counters = shared.counter_reader()
        self.suspects = shared.suspects()
        self.fleet = shared.fleet()
        self.refusals = shared.mgmt_refusals()
        self._mappings: tuple[object, views.MappingIndex] | None = None

    # ---- the gate ------------------------------------------------------------------------------------

    def gated(
        self,
        scope: str,
        handler: Callable[[Request, credentials.Principal], Awaitable[Response]],
        changes_state: bool = False,
    ) -> Handler:
        async def endpoint(request: Request) -> Response:
            try:
                principal = self.verifier.authorize(
                    request.headers.get("authorization"), _query_has_token(request), scope, changes_state
                )
            except credentials.AuthError as exc:
                self.refusals.inc(exc.reason)
                client = request.client.host if request.client else ""
                event(
                    "mgmt_auth_refused",
                    "warning",
                    reason=exc.reason,
                    status=exc.status,
                    method=request.method,
                    path=request.url.path,
                    client=client,
                )
                if exc.status == 401:
                    challenge = 'Bearer realm="sentin8-proxy"'
                    if exc.reason not in ("missing", "not_bearer"):
                        challenge += ', error="invalid_token"'
                    return JSONResponse(
                        {"error": "unauthorized", "reason": exc.reason},
                        status_code=401,
                        headers={"WWW-Authenticate": challenge},
                    )
                return JSONResponse(
                    {"error": "forbidden", "reason": exc.reason, "scope": scope},
                    status_code=403,
                    headers={"WWW-Authenticate": f'Bearer error="insufficient_scope", scope="{scope}"'},
                )
            try:
                return await handler(request, principal)
            except OverlayError as exc:
                return _error(422, "invalid", exc.reason, field=exc.field)
            except NotSaved as exc:  # the disk, not the request: the same change may succeed later
                event("policy_not_saved", "error", method=request.method, reason=exc.reason)
                return JSONResponse(
                    {"error": "not_saved", "detail": exc.reason}, status_code=503, headers={"Retry-After": "30"}
                )

        return endpoint

    def table(self) -> routing.RoutingTable | None:
        return self.routes.current()

    def tls_health(self) -> dict[str, Any]:
        """The TLS edge's part of /health (certificates present but rejected, ticket rotation), from shared
        memory. It never changes the status code by itself: a rejected certificate still serves bootstrap."""
        return self.shared.tls_health()

    def service_stats(self) -> dict[str, dict[str, Any]]:
        """Per-service figures for /stats and the dashboard (issue #9's shared counters): per service
        ``requests``, ``status_2xx``..``status_5xx`` and ``latency_buckets_ms`` like the fleet's."""
        return service_stats(self.shared)

    # ---- endpoints -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        totals = self.counters.total()
        code, body = views.health(
            self.table(),
            self.fleet.state,
            self.fleet.workers_listening,
            totals,
            self.clock(),
            VERSION,
            tls=self.tls_health(),
            cluster=self.shared.cluster_health(),
        )
        return JSONResponse(body, status_code=code, headers={"Cache-Control": "no-store"})

    async def backends(self, request: Request, _: credentials.Principal) -> Response:
        body = views.backends(self.table(), self.suspects.suspect_until, self.clock(), self.cfg.sources.health_fresh_s)
        return JSONResponse(body)

    async def mappings(self, request: Request, _: credentials.Principal) -> Response:
        limit = _int_param(request, "limit", views.MAPPINGS_DEFAULT_LIMIT, 1, views.MAPPINGS_MAX_LIMIT)
        offset = _int_param(request, "offset", 0, 0, 1 << 31)
        table = self.table()
        if self._mappings is None or self._mappings[0] is not table:
            self._mappings = (table, views.MappingIndex(table, self.cfg.sources.domains))
        body = self._mappings[1].query(
            request.query_params.get("host"), request.query_params.get("service"), limit, offset
        )
        return JSONResponse(body)

    async def stats(self, request: Request, _: credentials.Principal) -> Response:
        totals = self.counters.total()
        body = views.stats(
            totals, self.clock(), services=self.service_stats(), latency_buckets=views.latency_buckets(totals)
        )
        table = self.table()
        body["stale"] = bool(table is not None and table.stale)
        body["fleet_state"] = self.fleet.state
        body["auth_refusals"] = self.refusals.read()
        body["policy"] = self.policy.get()  # values only, no secret: the dashboard shows what is in force
        body["workers"] = self._per_worker()
        return JSONResponse(body)

    def _per_worker(self) -> list[dict[str, int]]:
        """A few counters per worker slot that ever served: shows how the kernel spreads the load."""
        out = []
        for slot in range(self.counters.slots):
            block = self.counters.block(slot)
            if block["accepted"] or block["requests"]:
                out.append({"slot": slot, **{k: block[k] for k in views.PER_WORKER_COUNTERS}})
        return out

    async def policy_get(self, request: Request, _: credentials.Principal) -> Response:
        return JSONResponse(self.policy.get())

    async def policy_put(self, request: Request, principal: credentials.Principal) -> Response:
        raw = bytearray()
        async for chunk in request.stream():  # a policy body is ~100 bytes: never buffer more than the cap
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes", field="body")
        try:
            body = json.loads(bytes(raw)) if raw else None
        except (ValueError, UnicodeDecodeError):
            raise OverlayError("body", "not valid JSON") from None
        view, changes = self.policy.change(body)
        event("policy_changed", sub=principal.sub, jti=principal.jti, changes=changes, generation=view["generation"])
        return JSONResponse(await self._share(view))

    async def policy_delete(self, request: Request, principal: credentials.Principal) -> Response:
        view = self.policy.reset()
        event("policy_reset", sub=principal.sub, jti=principal.jti, generation=view["generation"])
        return JSONResponse(await self._share(view))

    async def _share(self, view: dict[str, Any]) -> dict[str, Any]:
        """Cluster mode: publish the change to the other hosts now (bounded); unreachable, it is applied here
        already and published by the sync task once Valkey answers (``unshared`` says so)."""
        if self.policy_sync is None:
            return view
        try:
            await self.policy_sync.push()
        except Exception as exc:
            event("policy_share_deferred", "warning", error=type(exc).__name__)
            return view
        return self.policy.get()

    async def metrics(self, request: Request) -> Response:
        body, content_type = exposition(self.shared, request.headers.get("accept"))
        return Response(body, media_type=content_type)

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(openapi_document(VERSION))

    async def dashboard(self, request: Request) -> Response:
        # the page holds no data and no secret: it asks for a token and calls the API like any client
        return HTMLResponse(
            DASHBOARD_HTML,
            headers={
                "Cache-Control": "no-store",
                "Content-Security-Policy": "default-src 'self'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'",
                "X-Frame-Options": "DENY",
                "Referrer-Policy": "no-referrer",
            },
        )

    def starlette(self) -> Starlette:
        routes = [
            Route("/", self.dashboard, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
            Route("/backends", self.gated(credentials.SCOPE_BACKENDS, self.backends), methods=["GET"]),
            Route("/mappings", self.gated(credentials.SCOPE_MAPPINGS, self.mappings), methods=["GET"]),
            Route("/stats", self.gated(credentials.SCOPE_STATS, self.stats), methods=["GET"]),
            Route("/policy", self._policy_dispatch(), methods=["GET", "PUT", "DELETE"]),
        ]
        return Starlette(routes=routes)

    def _policy_dispatch(self) -> Handler:
        get = self.gated(credentials.SCOPE_POLICY, self.policy_get)
        put = self.gated(credentials.SCOPE_POLICY, self.policy_put, changes_state=True)
        delete = self.gated(credentials.SCOPE_POLICY, self.policy_delete, changes_state=True)

        async def endpoint(request: Request) -> Response:
            return await {"GET": get, "PUT": put, "DELETE": delete}[request.method](request)

        return endpoint
