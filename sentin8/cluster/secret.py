"""The cluster's operator secret (``cluster.secret_env``): read from the environment by the supervisor before
anything binds or forks, so a missing or short secret is one ``key: reason`` line and exit 2.

It keys what hosts share in Valkey (the wrapped session-ticket state); the limiter never needs it, but a cluster
started without it would come up unable to share ticket keys later, so it is required whenever cluster mode is on.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import Cluster
from ..env_secret import secret_from_env


def load_secret(cfg: Cluster, environ: Mapping[str, str]) -> bytes:
    """The secret from the variable ``cluster.secret_env`` names; ConfigError naming that key when it is unset
    or shorter than 32 bytes."""
    return secret_from_env("cluster.secret_env", cfg.secret_env, environ)
