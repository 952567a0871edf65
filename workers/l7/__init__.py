"""HTTP/1.1 at the edge (ARCHITECTURE.md §3 step 6): one ``L7Bridge`` per client connection
(``connection.py``), one ``Exchange`` per request (``exchange.py`` + ``relay.py``, its lifecycle in
``state.py``), the admission steps (``admission.py``), the WAF's wait (``waf_wait.py``), a WebSocket tunnel
(``tunnel.py``), flow control and deadlines (``flow.py``, ``deadline.py``). What the worker provides is
``L7Context`` (``contract.py``)."""

from .connection import L7Bridge, PlainHTTPListener
from .contract import L7Context, RequestInfo
from .exchange import Exchange
from .state import ExchangeState

__all__ = ["Exchange", "ExchangeState", "L7Bridge", "L7Context", "PlainHTTPListener", "RequestInfo"]
