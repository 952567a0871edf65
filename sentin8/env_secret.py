"""A secret read from an environment variable the config names (``mgmt.jwt_secret_env``,
``cluster.secret_env``): one rule for every such secret, read by the supervisor before anything binds or forks.

Unset, empty or shorter than ``MIN_SECRET_BYTES`` is a ``ConfigError`` naming the key, so the fleet refuses to
start with a guessable secret rather than running with one.
"""

from __future__ import annotations

from collections.abc import Mapping

from .config import ConfigError

MIN_SECRET_BYTES = 32


def secret_from_env(key: str, variable: str, environ: Mapping[str, str]) -> bytes:
    """The bytes of ``environ[variable]``; ``ConfigError("key: …")`` when unset or too short."""
    value = environ.get(variable)
    if not value:
        raise ConfigError(f"{key}: environment variable {variable} is not set")
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{key}: the secret in {variable} is {len(secret)} bytes, at least {MIN_SECRET_BYTES} are required"
        )
    return secret
