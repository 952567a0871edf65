"""Management API authentication: Bearer JWT (HS256 only), scopes, one-use ``jti`` for changes. Sans-IO.

The rules (issue #10, ARCHITECTURE.md §6, after rsx-gateway): signature HS256 with a secret of at least 32 bytes;
``exp``, ``iat``, ``aud``, ``iss``, ``sub`` and ``jti`` required; ``nbf`` honoured when present; 30 s leeway at
most; scopes from the space-separated ``scope`` claim (RFC 9068). A ``jti`` presented on a request that changes
state is remembered in a bounded FIFO and refused the second time; reads may reuse a token until it expires.
Every refusal carries a short ``reason`` that is counted and logged, never the token itself.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

import jwt

from ..config import Mgmt
from ..env_secret import MIN_SECRET_BYTES
from .credentials import AuthError, Principal

LEEWAY_S = 30
JTI_CAPACITY = 16_384
REQUIRED_CLAIMS = ("exp", "iat", "aud", "iss", "sub", "jti")
ALGORITHM = "HS256"
# Every AuthError reason is one of sentin8.shm.mgmt_refusals.REFUSAL_REASONS (counted by reason in shm).


def mint(
    secret: bytes, cfg: Mgmt, scopes: list[str], ttl_s: float, sub: str = "operator", now: float | None = None
) -> str:
    """A token the verifier accepts: what ``sentin8-proxy token`` and ``demo`` hand to operators."""
    now = time.time() if now is None else now
    claims = {
        "iss": cfg.jwt_issuer,
        "aud": cfg.jwt_audience,
        "sub": sub,
        "iat": int(now),
        "exp": int(now + ttl_s),
        "jti": uuid.uuid4().hex,
        "scope": " ".join(scopes),
    }
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


class JtiStore(Protocol):
    def use(self, jti: str, exp: float, now: float) -> bool: ...  # False = seen before (a replay)


class JtiTracker:
    """One-use ``jti`` values, bounded: the oldest is forgotten first once ``capacity`` are held.

    An entry whose token has expired is useless to keep (the verifier refuses the token anyway), so expired
    entries leave early; the FIFO bound only matters under a burst of valid changes.
    """

    def __init__(self, capacity: int = JTI_CAPACITY) -> None:
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()  # jti -> exp, in insertion order

    def __len__(self) -> int:
        return len(self._seen)

    def use(self, jti: str, exp: float, now: float) -> bool:
        """Record ``jti``; False when it was already used (a replay)."""
        if jti in self._seen:
            return False
        self._seen[jti] = exp
        while len(self._seen) > self.capacity:
            self._seen.popitem(last=False)
        # the oldest entries expire first as long as TTLs are similar: drop expired ones from the front
        while self._seen:
            oldest_jti, oldest_exp = next(iter(self._seen.items()))
            if oldest_exp + LEEWAY_S >= now or oldest_jti == jti:
                break
            self._seen.popitem(last=False)
        return True


_REASONS: tuple[tuple[type[Exception], str], ...] = (
    (jwt.ExpiredSignatureError, "expired"),
    (jwt.ImmatureSignatureError, "not_yet_valid"),
    (jwt.InvalidAudienceError, "bad_audience"),
    (jwt.InvalidIssuerError, "bad_issuer"),
    (jwt.MissingRequiredClaimError, "missing_claim"),
    (jwt.InvalidAlgorithmError, "bad_algorithm"),
    (jwt.InvalidSignatureError, "bad_signature"),
    (jwt.DecodeError, "malformed"),
)


class Verifier:
    """Checks a request's credentials against the rules above; raises AuthError, returns a Principal."""

    def __init__(
        self, secret: bytes, cfg: Mgmt, clock: Callable[[], float] = time.time, jtis: JtiStore | None = None
    ) -> None:
        if len(secret) < MIN_SECRET_BYTES:
            raise ValueError("secret too short")
        self._secret = secret
        self.audience = cfg.jwt_audience
        self.issuer = cfg.jwt_issuer
        self.clock = clock
        self.jtis: JtiStore = jtis if jtis is not None else JtiTracker()  # the mgmt process passes shm's

    def decode(self, token: str) -> Principal:
        """Signature and claims, without scope or replay checks."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise AuthError(401, "malformed") from None
        if header.get("alg") != ALGORITHM:  # `none`, HS384/512, RS*/ES*: refused before any key is tried
            raise AuthError(401, "bad_algorithm")
        try:
            claims = jwt.decode(
                token,
                self._secret,
                algorithms=[ALGORITHM],
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY_S,
                options={"require": list(REQUIRED_CLAIMS), "verify_signature": True},
            )
        except jwt.PyJWTError as exc:
            reason = next((r for kind, r in _REASONS if isinstance(exc, kind)), "invalid")
            raise AuthError(401, reason) from None
        sub, jti, scope = claims.get("sub"), claims.get("jti"), claims.get("scope", "")
        if not isinstance(sub, str) or not sub or not isinstance(jti, str) or not jti:
            raise AuthError(401, "missing_claim")
        if not isinstance(scope, str):
            raise AuthError(401, "bad_scope_claim")
        exp = claims["exp"]
        if not isinstance(exp, int | float):
            raise AuthError(401, "malformed")
        return Principal(sub=sub, jti=jti, scopes=frozenset(scope.split()), exp=float(exp))

    def authorize(self, authorization: str | None, query_has_token: bool, scope: str, changes_state: bool) -> Principal:
        """The whole gate for one request. ``query_has_token``: a token-looking query parameter was sent,
        which is refused even when a header is present (tokens in URLs end up in logs)."""
        if query_has_token:
            raise AuthError(401, "token_in_query")
        if not authorization:
            raise AuthError(401, "missing")
        kind, _, token = authorization.partition(" ")
        if kind.lower() != "bearer" or not token.strip():
            raise AuthError(401, "not_bearer")
        principal = self.decode(token.strip())
        if scope not in principal.scopes:
            raise AuthError(403, "scope")
        if changes_state and not self.jtis.use(principal.jti, principal.exp, self.clock()):
            raise AuthError(401, "replay")
        return principal
