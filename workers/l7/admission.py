"""The admission steps of one request, in order (ARCHITECTURE.md §3 step 6): everything decided on the head
alone before a byte goes upstream.

    refused client (connection cap) -> in-flight cap (503) -> :80 only serves ACME challenges (404)
    -> SNI present (421) -> Host vs SNI (421) -> ACME challenge: to the acme service, untouched
    -> resolve Host (421) -> declared body over limits.max_request_body_bytes (413)
    -> ctx.policy (429/403/...) -> header hygiene -> the upstream head

What is an ACME challenge is ``sentin8/http/acme.py``'s decision (``head.acme``): only what a CA sends; the
rest of ``/.well-known/acme-challenge/`` takes the normal path like any other request.

A step that refuses answers through the exchange (``respond_error``: answer and close, ``respond_local``:
answer, keep-alive allowed) and admission ends there. A new step goes here, its logic in ``sentin8/``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sentin8 import refusals
from sentin8.http.acme import CHALLENGE, NOT_A_CHALLENGE
from sentin8.http.body import body_over_limit
from sentin8.http.framing import RequestHead, request_head
from sentin8.http.headers import Header, forward_headers, passthrough_headers

from .contract import RequestInfo

if TYPE_CHECKING:
    from .connection import L7Bridge
    from .exchange import Exchange


def admit(ex: Exchange, bridge: L7Bridge, head: RequestHead) -> tuple[bytes, bytes, bool] | None:
    """The head to send upstream, the correlation id in it and whether the WAF may inspect the request
    (``ex.routed`` has been told where it goes), or None when a step answered."""
    ctx = bridge.ctx
    if bridge.refuse_status:
        ex.respond_error(bridge.refuse_status)
        return None
    if ctx.overloaded():
        # fail fast instead of queueing (rsx-gateway): the client may retry in a second, on this connection
        ctx.refused(refusals.INFLIGHT_CAP)
        ex.respond_local(503, [(b"Retry-After", b"1")], keep_alive=True)
        return None
    is_acme = head.acme == CHALLENGE
    if head.acme == NOT_A_CHALLENGE:
        ctx.count("acme_not_challenge")  # no bypass: it goes on like any request (on :80, the 404 below)
    if bridge.acme_only and not is_acme:
        ex.respond_error(404)
        return None
    sni = bridge.sni
    if bridge.tls and sni is None:
        # SNI is the routing key (ARCHITECTURE.md §3 step 4): a TLS client that sent none got the bootstrap
        # certificate so that it can read this answer; it is never routed by Host alone.
        ctx.count("no_sni")
        ex.respond_error(421)
        return None
    host = head.host or (sni or "")
    if not host:
        ex.respond_error(400)  # HTTP/1.0 without Host and no SNI to stand in for it: nothing to route by
        return None
    if sni is not None and head.host and head.host != sni:
        ex.respond_error(421)  # a connection is bound to the name it was opened for
        return None
    if is_acme:
        # HTTP-01 challenges: straight to the acme service, before any host lookup; nothing injected, no
        # policy, no WAF (ARCHITECTURE.md §3 step 6).
        service = ctx.cfg.acme.service
        ex.routed(service, ctx.service_id(service), host)
        corr = b""
        headers = passthrough_headers(head.headers, http10=head.version == "1.0")
        ctx.count("acme_requests")
    else:
        route = ctx.resolve(host)
        if route is None:
            ex.respond_error(421)
            return None
        ex.routed(route.service, route.sidx, host)
        if head.content_length and body_over_limit(head.content_length, ctx.cfg.limits.max_request_body_bytes):
            ctx.refused(refusals.BODY_CAP)  # refused before a byte of the body is read (a streamed one: reader.py)
            ex.respond_error(413)
            return None
        verdict = ctx.policy(
            RequestInfo(head.method, head.target, head.path, host, bridge.client_ip, route, head.headers, bridge.scheme)
        )
        if verdict is not None:
            if isinstance(verdict, int):
                ctx.refused(refusals.POLICY_OTHER)
                ex.respond_error(verdict)
            else:
                ctx.refused(verdict.refusal)
                ex.respond_local(verdict.status, verdict.headers, keep_alive=verdict.keep_alive)
            return None
        headers, corr = forward_headers(
            head.headers,
            route,
            client_ip=bridge.client_ip,
            proto=bridge.scheme,
            host=head.authority or host.encode(),
            hostname=host,
            websocket=head.websocket,
            client_cert=bridge.client_cert_der(),
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
    return request_head(head.method, head.target, headers, framing=framing), corr, not is_acme
