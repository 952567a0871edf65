"""The cluster's operator secret: the systemd credential ``cluster.secret_credential`` where systemd loaded it,
else the environment variable ``cluster.secret_env`` (the rule: ``sentin8.env_secret``). Read by the supervisor
before anything binds or forks, so a missing or short secret is one ``key: reason`` line and exit 2.

It keys what hosts share in Valkey (the wrapped session-ticket state); the limiter never needs it, but a cluster
started without it would come up unable to share ticket keys later, so it is required whenever cluster mode is on.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..config import Cluster
from ..env_secret import secret_from_credential_or_env


def load_secret(cfg: Cluster, environ: Mapping[str, str]) -> bytes:
    """The secret; ConfigError naming ``cluster.secret_credential`` (a credential unreadable or under 32 bytes)
    or ``cluster.secret_env`` (neither a credential nor the variable, or the variable under 32 bytes)."""
    return secret_from_credential_or_env(
        "cluster.secret_env", cfg.secret_env, "cluster.secret_credential", cfg.secret_credential, environ
    )
