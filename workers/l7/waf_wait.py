"""One request's wait for the WAF: the body is buffered (up to the WAF's ``body_max``) and inspected before
anything goes upstream (ARCHITECTURE.md §3 step 6).

    ROUTING: the rule set may still be loading (a runtime change; ``WafGate.when_ready``)
    -> INSPECTING: the body is held by the connection until complete, or known to exceed ``body_max``
    -> VERDICT: ``WafGate.inspect`` runs (inline when small, else on a thread)
    -> forward, or 403 (400: a body that claims a format and does not parse), or 413 / 503

A request whose declared length exceeds ``body_max`` (without ``partial_bodies``) is refused before a byte of
its body is read. ``Expect: 100-continue`` is answered here: the backend cannot, it has not seen the request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sentin8 import refusals
from sentin8.http.head_writer import REASONS
from sentin8.waf import WafEngine, WafRequest, WafVerdict
from workers.waf_gate import WafGate

from .state import ROUTING, VERDICT

if TYPE_CHECKING:
    from .exchange import Exchange

log = logging.getLogger("sentin8.l7")


class WafWait:
    __slots__ = ("engine", "ex", "gate")

    def __init__(self, ex: Exchange, gate: WafGate) -> None:
        self.ex = ex
        self.gate = gate
        self.engine: WafEngine | None = None

    def start(self) -> None:
        self.gate.when_ready(self._engine_ready)

    def _engine_ready(self, engine: WafEngine | BaseException | None) -> None:
        ex = self.ex
        if ex.state is not ROUTING:
            return  # the client went away while the rules loaded
        if isinstance(engine, BaseException):
            log.error("WAF rule set failed to load: failing closed", exc_info=engine)
            ex.client.ctx.count("waf_errors")
            ex.respond_error(503)
        elif engine is None:
            ex.forward()  # turned off meanwhile
        else:
            self._begin(engine)

    def _begin(self, engine: WafEngine) -> None:
        ex = self.ex
        req = ex.req
        head = req.head
        assert head is not None
        s = engine.settings
        if head.content_length is not None and head.content_length > s.body_max and not s.partial_bodies:
            ex.client.ctx.refused(refusals.WAF_BODY_TOO_LARGE)
            ex.respond_error(413)  # refused before a byte of it is read
            return
        self.engine = engine
        ex.await_body(s.body_max)
        if not req.complete and head.has_body and head.expect_continue:  # never on HTTP/1.0 (framing.py)
            # The WAF needs the body before anything goes upstream, so the backend cannot say 100 Continue:
            # we do, or the client would wait for it (curl: 1 s) before sending the body we wait for.
            ex.send_continue()
        self.body_progress()

    def body_progress(self) -> None:
        """Inspect once the body is complete, or as soon as it is known to be longer than the limit."""
        req = self.ex.req
        if req.complete or req.buffered > self.engine.settings.body_max:  # type: ignore[union-attr]
            self.run()

    def run(self) -> None:
        ex = self.ex
        engine = self.engine
        assert engine is not None
        req = ex.req
        head = req.head
        assert head is not None
        s = engine.settings
        body = (req.body[0] if len(req.body) == 1 else b"".join(req.body)) if req.body else b""
        truncated = not req.complete or len(body) > s.body_max
        if truncated:
            if not s.partial_bodies:
                ex.client.ctx.refused(refusals.WAF_BODY_TOO_LARGE)
                ex.respond_error(413)
                return
            body = body[: s.body_max]
        ex.inspecting()
        wreq = WafRequest(
            head.method, head.target, head.version, head.headers, ex.host, ex.client.facts.client_ip, body=body,
            truncated=truncated, tx_id=ex.corr,
        )  # fmt: skip
        self.gate.inspect(engine, wreq, len(head.target) + req.budget.size + len(body), self._done)

    def _done(self, result: WafVerdict | BaseException) -> None:
        ex = self.ex
        if ex.state is not VERDICT:
            return  # the client went away meanwhile
        ctx = ex.client.ctx
        if isinstance(result, BaseException):
            log.error("WAF inspection failed: failing closed", exc_info=result)
            ctx.count("waf_errors")
            ex.respond_error(503)
            return
        corr = ex.corr
        self.gate.report(result, ex.service, corr)
        if result.blocked:
            ctx.refused(refusals.WAF)
            status = 400 if result.status == 400 else 403  # 400: a body that claims a format and does not parse
            body = b"%d %s\nrequest id: %s\n" % (status, REASONS[status], corr)
            ex.respond_local(status, [(b"X-Correlation-Id", corr)], keep_alive=False, body=body)
            return
        ex.forward()
