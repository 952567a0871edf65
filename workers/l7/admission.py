"""The admission steps of one request, in order (ARCHITECTURE.md §3 step 6): everything decided on the head
alone before a byte goes upstream.

    refused client (connection cap) -> in-flight cap (503) -> :80 only serves ACME challenges (404)
    -> SNI present (421) -> Host vs SNI (421) -> ACME challenge: to the acme service, untouched
    -> resolve Host (421) -> declared body over limits.max_request_body_bytes (413)
    -> ctx.policy (429/403/...) -> header hygiene -> the upstream head

What is an ACME challenge is ``sentin8/http/acme.py``'s decision (``head.acme``): only what a CA sends; the
rest of ``/.well-known/acme-challenge/`` takes the normal path like any other request.

``admit`` returns its outcome and the exchange acts on it: ``Refuse`` (answer ``status`` as an error, which
closes an HTTP/1.1 connection, or as a local answer that may keep it) or ``Admitted`` (the upstream head, the
correlation id in it, whether the WAF inspects it). Both say where the request was routed when a step after
routing decided, so that it is counted per service. Admission calls nothing back; it only reads the connection's
facts (``downstream.ConnectionFacts``) and the worker's context. A new step goes here, its logic in ``sentin8/``.
"""

from __future__ import annotations

from sentin8 import refusals
from sentin8.http.acme import CHALLENGE, NOT_A_CHALLENGE
from sentin8.http.body import body_over_limit
from sentin8.http.framing import RequestHead
from sentin8.http.head_writer import request_head
from sentin8.http.headers import Header, forward_headers, passthrough_headers

from .contract import L7Context, RequestInfo
from .downstream import ConnectionFacts


class Refuse:
    """Answer ``status`` ourselves. ``local``: as a local answer with ``headers``, the client side kept when
    ``keep_alive`` allows; else as an error. ``service``/``sidx``/``host``: routed before the refusing step,
    so counted for this service.

    A plain class, not a dataclass: one is made per refused request and a dataclass's generated
    ``__init__`` is Python source even in the compiled build (bench/README.md, "Compiled hot path")."""

    __slots__ = ("headers", "host", "keep_alive", "local", "service", "sidx", "status")

    def __init__(
        self,
        status: int,
        headers: list[Header] | None = None,
        keep_alive: bool = False,
        local: bool = False,
        service: str = "",
        sidx: int = 0,
        host: str = "",
    ) -> None:
        self.status = status
        self.headers = headers
        self.keep_alive = keep_alive
        self.local = local
        self.service = service
        self.sidx = sidx
        self.host = host


class Admitted:
    """Forward: ``head_bytes`` is the upstream request head, ``corr`` the correlation id in it (empty for an
    ACME challenge), ``inspect`` whether the WAF may inspect the request. One per forwarded request: a plain
    class for the same reason as ``Refuse``."""

    __slots__ = ("corr", "head_bytes", "host", "inspect", "service", "sidx")

    def __init__(self, service: str, sidx: int, host: str, head_bytes: bytes, corr: bytes, inspect: bool) -> None:
        self.service = service
        self.sidx = sidx
        self.host = host
        self.head_bytes = head_bytes
        self.corr = corr
        self.inspect = inspect


Outcome = Refuse | Admitted


def admit(ctx: L7Context, facts: ConnectionFacts, head: RequestHead) -> Outcome:
    """Every step on the head alone, in order; the first that refuses decides (and has counted its refusal)."""
    if facts.refuse_status:
        return Refuse(facts.refuse_status)
    if ctx.overloaded():
        # fail fast instead of queueing (rsx-gateway): the client may retry in a second, on this connection
        ctx.refused(refusals.INFLIGHT_CAP)
        return Refuse(503, [(b"Retry-After", b"1")], keep_alive=True, local=True)
    is_acme = head.acme == CHALLENGE
    if head.acme == NOT_A_CHALLENGE:
        ctx.count("acme_not_challenge")  # no bypass: it goes on like any request (on :80, the 404 below)
    if facts.acme_only and not is_acme:
        return Refuse(404)
    sni = facts.sni
    if facts.tls and sni is None:
        # SNI is the routing key (ARCHITECTURE.md §3 step 4): a TLS client that sent none got the bootstrap
        # certificate so that it can read this answer; it is never routed by Host alone.
        ctx.count("no_sni")
        return Refuse(421)
    host = head.host or (sni or "")
    if not host:
        return Refuse(400)  # HTTP/1.0 without Host and no SNI to stand in for it: nothing to route by
    if sni is not None and head.host and head.host != sni:
        return Refuse(421)  # a connection is bound to the name it was opened for
    if is_acme:
        # HTTP-01 challenges: straight to the acme service, before any host lookup; nothing injected, no
        # policy, no WAF (ARCHITECTURE.md §3 step 6).
        service = ctx.cfg.acme.service
        sidx = ctx.service_id(service)
        corr = b""
        headers = passthrough_headers(head.headers, http10=head.version == "1.0")
        ctx.count("acme_requests")
    else:
        route = ctx.resolve(host)
        if route is None:
            return Refuse(421)
        service, sidx = route.service, route.sidx
        if head.content_length and body_over_limit(head.content_length, ctx.cfg.limits.max_request_body_bytes):
            ctx.refused(refusals.BODY_CAP)  # refused before a byte of the body is read (a streamed one: reader.py)
            return Refuse(413, service=service, sidx=sidx, host=host)
        verdict = ctx.policy(
            RequestInfo(head.method, head.target, head.path, host, facts.client_ip, route, head.headers, facts.scheme)
        )
        if verdict is not None:
            if isinstance(verdict, int):
                ctx.refused(refusals.POLICY_OTHER)
                return Refuse(verdict, service=service, sidx=sidx, host=host)
            ctx.refused(verdict.refusal)
            return Refuse(
                verdict.status, verdict.headers, keep_alive=verdict.keep_alive, local=True, service=service,
                sidx=sidx, host=host,
            )  # fmt: skip
        headers, corr = forward_headers(
            head.headers,
            route,
            client_ip=facts.client_ip,
            proto=facts.scheme,
            host=head.authority or host.encode(),
            hostname=host,
            websocket=head.websocket,
            client_cert=facts.client_cert,
            http10=head.version == "1.0",
        )
    if head.chunked:
        framing: Header | None = (b"Transfer-Encoding", b"chunked")
    elif head.content_length is not None:
        framing = (b"Content-Length", b"%d" % head.content_length)
    else:
        framing = None
    if not head.authority:
        headers.append((b"Host", host.encode()))  # HTTP/1.0 without Host: upstream is 1.1, Host is the SNI
    return Admitted(
        service, sidx, host, request_head(head.method, head.target, headers, framing=framing), corr, not is_acme
    )
