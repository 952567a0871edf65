"""The management API's credentials without the JWT library: the signing secret (read from the environment,
checked), the scope names, and what a verification yields (``Principal``) or refuses with (``AuthError``).

No PyJWT here, on purpose. The supervisor checks the secret before anything binds, imports the management app
so that a respawn only forks, and forks every worker and the resolver; the CLI builds its parser (scopes in the
help) for every command, ``run`` too. Through ``auth`` all of them would load PyJWT, and the fork would hand it
to every data-plane process, which never verifies a token. ``auth`` (the verifier, built in the management
process, and minting for the CLI's token commands) takes these from here.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from ..config import Mgmt
from ..env_secret import secret_from_env

SCOPE_BACKENDS = "proxy:backends:read"
SCOPE_MAPPINGS = "proxy:mappings:read"
SCOPE_STATS = "proxy:stats:read"
SCOPE_POLICY = "policy-admin"
ALL_SCOPES = (SCOPE_BACKENDS, SCOPE_MAPPINGS, SCOPE_STATS, SCOPE_POLICY)


def load_secret(cfg: Mgmt, environ: Mapping[str, str]) -> bytes:
    """The signing secret from the environment variable ``mgmt.jwt_secret_env`` names; ConfigError naming
    that key when it is missing or too short (the fleet refuses to boot with a guessable secret)."""
    return secret_from_env("mgmt.jwt_secret_env", cfg.jwt_secret_env, environ)


def new_secret() -> str:
    """A fresh secret for the demo: 48 URL-safe characters (288 bits)."""
    return secrets.token_urlsafe(36)


@dataclass(frozen=True)
class Principal:
    """Who a verified token speaks for."""

    sub: str
    jti: str
    scopes: frozenset[str]
    exp: float


class AuthError(Exception):
    """A refused token: ``status`` 401 (bad or missing token) or 403 (valid, without the scope)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
