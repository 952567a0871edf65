"""Which requests are ACME HTTP-01 challenges, sans-IO (RFC 8555 §8.3).

A challenge skips the edge's rules: it goes to ``acme.service`` with any Host, without policy, WAF or header
injection (ARCHITECTURE.md §3 step 6), because a name being validated may not be routed yet. So the bypass
must cover what a CA actually sends and nothing else: ``GET`` (or ``HEAD``) of exactly
``/.well-known/acme-challenge/<token>`` in origin-form, the token one or more characters of the base64url
alphabet (RFC 8555 §8.1: ``[A-Za-z0-9_-]``, no padding), no query, no body, no upgrade. That alphabet leaves
out every character a traversal or an encoding trick needs (``.``, ``/``, ``%``, ``\\``, ``;``, ``?``, ``#``),
so ``..``, ``%2e``, ``%2f``, ``%5c``, a second slash, path parameters and fragments all fail the one
``fullmatch``; the prefix is compared case-sensitively (paths are), and an absolute-form target
(``https://host/.well-known/...``, which CAs do not send) is not a challenge either.

Anything else under the prefix is ``NOT_A_CHALLENGE``: it takes the normal path (routing by Host, policy, WAF,
injection), on :80 it gets 404, and it is counted (``acme_not_challenge``).
"""

from __future__ import annotations

import re

ACME_PREFIX = b"/.well-known/acme-challenge/"

NOT_ACME = 0  # nothing to do with ACME
CHALLENGE = 1  # what a CA sends: the bypass applies
NOT_A_CHALLENGE = 2  # under the prefix, but not a challenge: the normal path (404 on :80)

_CHALLENGE = re.compile(rb"/\.well-known/acme-challenge/[A-Za-z0-9_-]+")


def acme_challenge(method: bytes, target: bytes, *, origin_form: bool, body: bool, upgrade: bool) -> int:
    """Classify a request: ``CHALLENGE``, ``NOT_A_CHALLENGE`` or ``NOT_ACME``.

    ``target`` is the request target in origin-form (an absolute-form one already reduced to its path and
    query, with ``origin_form`` False); ``body`` whether the request has one; ``upgrade`` whether it asks to
    switch protocols (a WebSocket handshake).
    """
    if not target.startswith(ACME_PREFIX):
        return NOT_ACME
    if (
        origin_form
        and (method == b"GET" or method == b"HEAD")
        and not body
        and not upgrade
        and _CHALLENGE.fullmatch(target) is not None
    ):
        return CHALLENGE
    return NOT_A_CHALLENGE
