"""The lifecycle of one exchange (h11's idea: named states and a transition table, no I/O).

An exchange is in exactly one ``ExchangeState``; ``_to`` is the only place it changes, and it refuses a
transition the table below does not list (a bug caught where it happens, not three callbacks later):

    state          what is going on                                          next
    ROUTING        admission (admission.py); may wait for the WAF's rules    INSPECTING CONNECTING SENDING AWAITING
                                                                             ANSWERED DONE
    INSPECTING     the WAF waits for the body, held by the connection        VERDICT DONE
    VERDICT        the WAF inspects; nothing has gone upstream               CONNECTING SENDING AWAITING DONE
    CONNECTING     trying the candidates (a pooled connection or a new one)  SENDING AWAITING DONE
    SENDING        attached; the request body is still going upstream        AWAITING RESPONSE_HEAD CONNECTING DONE
    AWAITING       all sent; the backend's response deadline runs            RESPONSE_HEAD CONNECTING DONE
    RESPONSE_HEAD  response bytes came, the final head is not relayed yet    STREAMING UPGRADING DONE
                   (1xx interim responses are relayed here)
    STREAMING      the final head is relayed, the body streams to the client RECEIVED DONE
    UPGRADING      a 101 that proves WebSocket; the parser's upgrade follows TUNNEL DONE
    TUNNEL         raw bytes both ways (tunnel.py)                           DONE
    RECEIVED       the whole response is relayed                             DONE
    ANSWERED       answered by the proxy; the rest of the body is dropped    DONE
    DONE           finished or abandoned: every later event is ignored       -

SENDING/AWAITING -> CONNECTING is the one replay: a pooled connection the backend had closed, before any
response byte, for an idempotent request with no body byte sent (RFC 9110 §9.2.2). A response may start
before the request body has all gone (an early response): the body keeps flowing in RESPONSE_HEAD and
STREAMING. What is not lifecycle stays a plain field: whether the backend's body ends at its close
(``close_delimited``), whether the connection came warm from the pool. How the response is framed towards the
client (chunking, closing, our own 100 Continue) is the client side's (downstream.py), not the exchange's.
"""

from __future__ import annotations

from enum import IntEnum


class ExchangeState(IntEnum):
    ROUTING = 0
    INSPECTING = 1
    VERDICT = 2
    CONNECTING = 3
    SENDING = 4
    AWAITING = 5
    RESPONSE_HEAD = 6
    STREAMING = 7
    UPGRADING = 8
    TUNNEL = 9
    RECEIVED = 10
    ANSWERED = 11
    DONE = 12


# Module-level names: a global lookup on the per-request path instead of an attribute of the enum class.
(ROUTING, INSPECTING, VERDICT, CONNECTING, SENDING, AWAITING, RESPONSE_HEAD, STREAMING, UPGRADING, TUNNEL,
 RECEIVED, ANSWERED, DONE) = ExchangeState  # fmt: skip

TRANSITIONS: dict[ExchangeState, frozenset[ExchangeState]] = {
    ROUTING: frozenset({INSPECTING, CONNECTING, SENDING, AWAITING, ANSWERED, DONE}),
    INSPECTING: frozenset({VERDICT, DONE}),
    VERDICT: frozenset({CONNECTING, SENDING, AWAITING, DONE}),
    CONNECTING: frozenset({SENDING, AWAITING, DONE}),
    SENDING: frozenset({AWAITING, RESPONSE_HEAD, CONNECTING, DONE}),
    AWAITING: frozenset({RESPONSE_HEAD, CONNECTING, DONE}),
    RESPONSE_HEAD: frozenset({STREAMING, UPGRADING, DONE}),
    STREAMING: frozenset({RECEIVED, DONE}),
    UPGRADING: frozenset({TUNNEL, DONE}),
    TUNNEL: frozenset({DONE}),
    RECEIVED: frozenset({DONE}),
    ANSWERED: frozenset({DONE}),
    DONE: frozenset(),
}
# The table as one bit mask per state: checking a transition is an index and a shift.
LEGAL = tuple(sum(1 << s for s in TRANSITIONS[state]) for state in ExchangeState)


def allowed(current: ExchangeState, new: ExchangeState) -> bool:
    """Whether the table lets an exchange go from ``current`` to ``new`` (``Exchange._to`` inlines this)."""
    return bool(LEGAL[current] >> new & 1)


# The final response head has gone to the client (or the proxy answered): an error can only close.
HEAD_SENT = frozenset({STREAMING, RECEIVED, TUNNEL, ANSWERED, DONE})


class ExchangeStateError(RuntimeError):
    """A transition the table does not list: a bug in the bridge."""
