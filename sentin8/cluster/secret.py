"""The cluster's operator secret (``cluster.secret_env``): read from the environment by the supervisor before
anything binds or forks, so a missing or short secret is one ``key: reason`` line and exit 2.

It keys what hosts share in Valkey (the wrapped session-ticket state); the limiter never needs it, but a cluster
started without it would come up unable to share ticket keys later, so it is required whenever cluster mode is on.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import Cluster, ConfigError

MIN_SECRET_BYTES = 32


def load_secret(cfg: Cluster, environ: Mapping[str, str]) -> bytes:
    """The secret from the variable ``cluster.secret_env`` names; ConfigError naming that key when it is unset
    or shorter than 32 bytes."""
    value = environ.get(cfg.secret_env)
    if not value:
        raise ConfigError(f"cluster.secret_env: environment variable {cfg.secret_env} is not set")
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"cluster.secret_env: the secret in {cfg.secret_env} is {len(secret)} bytes,"
            f" at least {MIN_SECRET_BYTES} are required"
        )
    return secret
