"""A secret the config names, from a systemd credential or an environment variable (``mgmt.jwt_secret_env``,
``cluster.secret_env`` / ``cluster.secret_credential``): one rule for every such secret, read by the supervisor
before anything binds or forks.

Where systemd runs the fleet, ``LoadCredential=NAME:/path`` (or ``LoadCredentialEncrypted=``, ``SetCredential=``)
puts the secret in ``$CREDENTIALS_DIRECTORY/NAME``: a file only this service can read, never in the environment
(which ``/proc/PID/environ``, crash reports and child processes see). So a secret with a credential name is read
from there when systemd set ``$CREDENTIALS_DIRECTORY`` and the credential exists; otherwise from its environment
variable, as before. A credential that exists wins over the variable. One trailing line ending is not part of the
secret (a file written by ``echo`` holds the same secret as the variable on a host that has no systemd).

Unset, empty, unreadable or shorter than ``MIN_SECRET_BYTES`` is a ``ConfigError`` naming the key and the
reason, so the fleet refuses to start (exit 2) with a guessable secret rather than running with one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .config import ConfigError

MIN_SECRET_BYTES = 32
CREDENTIALS_DIRECTORY = "CREDENTIALS_DIRECTORY"  # set by systemd for a unit with credentials (systemd.exec(5))


def _checked(key: str, where: str, secret: bytes) -> bytes:
    if len(secret) < MIN_SECRET_BYTES:
        raise ConfigError(
            f"{key}: the secret in {where} is {len(secret)} bytes, at least {MIN_SECRET_BYTES} are required"
        )
    return secret


def secret_from_env(key: str, variable: str, environ: Mapping[str, str]) -> bytes:
    """The bytes of ``environ[variable]``; ``ConfigError("key: …")`` when unset or too short."""
    value = environ.get(variable)
    if not value:
        raise ConfigError(f"{key}: environment variable {variable} is not set")
    return _checked(key, variable, value.encode())


def credential_path(credential: str, environ: Mapping[str, str]) -> str | None:
    """Where systemd put the credential ``credential`` for this service; None without one (no systemd
    credentials, or no credential name configured)."""
    directory = environ.get(CREDENTIALS_DIRECTORY)
    if not directory or not credential:
        return None
    return os.path.join(directory, credential)


def secret_from_credential_or_env(
    env_key: str, variable: str, credential_key: str, credential: str, environ: Mapping[str, str]
) -> bytes:
    """The secret from the systemd credential ``credential`` if systemd loaded it, else from the environment
    variable ``variable``. Errors name ``credential_key`` for a credential that exists but is unreadable or too
    short, ``env_key`` when neither is there."""
    path = credential_path(credential, environ)
    if path is not None:
        try:
            with open(path, "rb") as fh:
                raw = fh.read(64 * 1024)
        except FileNotFoundError:
            pass  # this unit loads no such credential: the environment variable, as without systemd
        except OSError as exc:
            raise ConfigError(f"{credential_key}: cannot read the credential {path}: {exc.strerror}") from None
        else:
            secret = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1] if raw.endswith(b"\n") else raw
            return _checked(credential_key, f"the credential {path}", secret)
    value = environ.get(variable)
    if not value:
        where = f" and no credential {credential!r} in ${CREDENTIALS_DIRECTORY}" if path is not None else ""
        raise ConfigError(f"{env_key}: environment variable {variable} is not set{where}")
    return _checked(env_key, variable, value.encode())
