"""Schemathesis hooks for the management API run: a fresh, fully scoped token for every request, so a change
(PUT/DELETE /policy, one-use jti) is exercised with valid input instead of being refused as a replay."""

from __future__ import annotations

import os

import schemathesis

from sentin8.config import Mgmt
from sentin8.mgmt.auth import mint
from sentin8.mgmt.credentials import ALL_SCOPES


@schemathesis.auth(refresh_interval=None)
class FreshToken:
    def get(self, case, ctx) -> str:
        return mint(os.environ["SENTIN8_MGMT_JWT_SECRET"].encode(), Mgmt(), list(ALL_SCOPES), 300, sub="schemathesis")

    def set(self, case, data, ctx) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}
