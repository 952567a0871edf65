"""The L7 edge (ARCHITECTURE.md §3 step 6): one protocol-neutral core and one folder per client protocol.

The core: one ``Exchange`` per request (``exchange.py`` + ``relay.py``, its lifecycle in ``state.py``), the
admission steps (``admission.py``, an outcome returned), the WAF's wait (``waf_wait.py``), and the seam to the
client side of a request (``downstream.py``: ``ConnectionFacts`` and the ``Downstream`` protocol). HTTP/1.1 is
``h1/``: one ``L7Bridge`` per connection (``h1/connection.py``, its request half ``h1/reader.py``, its response
half ``h1/writer.py``), flow control (``h1/flow.py``), a WebSocket tunnel (``h1/tunnel.py``). What the worker
provides is ``L7Context`` (``contract.py``)."""

from .contract import L7Context, RequestInfo
from .downstream import ConnectionFacts, Downstream
from .exchange import Exchange
from .h1.connection import L7Bridge, PlainHTTPListener
from .state import ExchangeState

__all__ = [
    "ConnectionFacts",
    "Downstream",
    "Exchange",
    "ExchangeState",
    "L7Bridge",
    "L7Context",
    "PlainHTTPListener",
    "RequestInfo",
]
