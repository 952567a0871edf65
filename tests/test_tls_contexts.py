"""What every context ``sentin8.tls`` builds is set up with for cost: idle buffers released, one ticket."""

from __future__ import annotations

from pathlib import Path

from OpenSSL import SSL

from sentin8 import tls
from sentin8.certstore import CertStore
from tests.test_tls import put_cert

RELEASE = SSL._lib.SSL_MODE_RELEASE_BUFFERS


def mode_of(ctx: SSL.Context) -> int:
    return ctx.set_mode(0)  # SSL_CTX_set_mode ORs nothing in and returns the context's mode


def test_server_and_upstream_contexts_release_idle_buffers(tmp_path: Path) -> None:
    store = CertStore(tmp_path / "certs", tmp_path / "state")
    put_cert(tmp_path / "certs", "a.test", ["a.test"])
    sni = tls.SNIContexts(store)
    per_cert = sni.context_for(store.lookup("a.test"))
    for ctx in (sni.front, per_cert, tls.server_context(), tls.upstream_context(), tls.upstream_context(pq_only=True)):
        assert mode_of(ctx) & RELEASE
    assert not mode_of(SSL.Context(SSL.TLS_METHOD)) & RELEASE  # OpenSSL's default: the check can fail
