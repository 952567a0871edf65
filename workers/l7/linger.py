"""The lingering close's bounds, one for both client shells (``h1/connection.py``, ``h2/connection.py``).

Closing a client connection, the proxy sends its last bytes, close_notify and FIN (``write_eof``), then keeps
reading and discards what the client still sends, until the client's FIN, ``LINGER_S`` or ``LINGER_BYTES``
(nginx's ``lingering_close``). Closed at once, a socket with unread bytes in the kernel (a request sent
before ours said close, the rest of a refused body, frames after a GOAWAY) answers with a TCP reset, and the
reset may destroy what the client has not read yet: the response, the GOAWAY (RFC 9112 §9.6).

One close skips it, as nginx's ``lingering_close on`` does: an h1 client whose last request said
``Connection: close`` (so it sends no other), read to its end, with nothing after it in our buffers or its
socket, can only send its own close now (``h1/connection.py``, ``_said_its_last``).
"""

from __future__ import annotations

LINGER_S = 2.0  # after our last bytes and FIN, how long the client's bytes are still read (and discarded)
# ... and how many: past either, the connection is closed. The bytes a client sent before it could read our
# GOAWAY or response are in flight when we close: its send buffer and our receive buffer (Linux's ceilings are
# 4 MiB and 6 MiB), more than a 1 MiB bound, which a flooding client overran and got a reset. Discarding them
# costs their decryption only; LINGER_S bounds the time.
LINGER_BYTES = 16 << 20
