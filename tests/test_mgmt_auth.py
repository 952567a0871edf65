"""The JWT gate and the jti tracker, sans-IO."""

from __future__ import annotations

import time

import jwt
import pytest

from sentin8.config import ConfigError, Mgmt
from sentin8.mgmt.auth import AuthError, JtiTracker, Verifier, mint
from sentin8.mgmt.credentials import load_secret
from tests import mgmt_client as mc

SECRET = "k" * 40
CFG = Mgmt()


def verifier(**kw) -> Verifier:
    return Verifier(SECRET.encode(), CFG, **kw)


def reason(tok: str | None, scope: str = "policy-admin", changes: bool = False, query: bool = False) -> str:
    with pytest.raises(AuthError) as info:
        verifier().authorize(None if tok is None else f"Bearer {tok}", query, scope, changes)
    return f"{info.value.status} {info.value.reason}"


def test_load_secret_names_the_key():
    with pytest.raises(ConfigError, match=r"^mgmt\.jwt_secret_env: environment variable SENTIN8_MGMT_JWT_SECRET"):
        load_secret(CFG, {})
    with pytest.raises(ConfigError, match=r"^mgmt\.jwt_secret_env: .* 31 bytes, at least 32"):
        load_secret(CFG, {"SENTIN8_MGMT_JWT_SECRET": "x" * 31})
    assert load_secret(CFG, {"SENTIN8_MGMT_JWT_SECRET": "x" * 32}) == b"x" * 32
    assert load_secret(Mgmt(jwt_secret_env="OTHER"), {"OTHER": "y" * 33}) == b"y" * 33


def test_minted_token_passes_and_carries_scopes():
    tok = mint(SECRET.encode(), CFG, ["proxy:backends:read", "policy-admin"], 60, sub="alice")
    p = verifier().authorize(f"Bearer {tok}", False, "policy-admin", False)
    assert p.sub == "alice" and p.scopes == {"proxy:backends:read", "policy-admin"}


def test_each_bad_token_has_its_reason():
    now = int(time.time())
    assert reason(None) == "401 missing"
    assert reason("x", query=True) == "401 token_in_query"
    assert reason(mc.token(SECRET, exp=now - 31, iat=now - 100)) == "401 expired"
    assert reason(mc.token(SECRET, nbf=now + 31)) == "401 not_yet_valid"
    assert reason(mc.token(SECRET, aud="x")) == "401 bad_audience"
    assert reason(mc.token(SECRET, iss="x")) == "401 bad_issuer"
    for claim in ("exp", "iat", "aud", "iss", "sub", "jti"):
        assert reason(mc.token(SECRET, **{claim: None})) == "401 missing_claim", claim
    assert reason(mc.token(SECRET, alg="HS512")) == "401 bad_algorithm"
    assert reason(jwt.encode(mc.claims(), None, algorithm="none")) == "401 bad_algorithm"
    assert reason(mc.token("w" * 40)) == "401 bad_signature"
    assert reason("a.b.c") == "401 malformed"
    assert reason(mc.token(SECRET, scope="proxy:backends:read")) == "403 scope"
    assert reason(mc.token(SECRET, sub=12)) in ("401 missing_claim", "401 invalid")


def test_leeway_is_30_seconds():
    now = int(time.time())
    v = verifier()
    v.authorize("Bearer " + mc.token(SECRET, exp=now - 20, iat=now - 100), False, "policy-admin", False)
    v.authorize("Bearer " + mc.token(SECRET, nbf=now + 20), False, "policy-admin", False)
    assert reason(mc.token(SECRET, exp=now - 40, iat=now - 100)) == "401 expired"


def test_jti_is_one_use_for_changes_only():
    v = verifier()
    tok = "Bearer " + mc.token(SECRET)
    v.authorize(tok, False, "policy-admin", False)
    v.authorize(tok, False, "policy-admin", False)  # reads reuse it
    v.authorize(tok, False, "policy-admin", True)
    with pytest.raises(AuthError) as info:
        v.authorize(tok, False, "policy-admin", True)
    assert (info.value.status, info.value.reason) == (401, "replay")
    v.authorize(tok, False, "policy-admin", False)  # still a valid read


def test_jti_tracker_is_bounded_fifo():
    t = JtiTracker(capacity=3)
    far = time.time() + 3600
    for j in "abcd":
        assert t.use(j, far, time.time())
    assert len(t) == 3
    assert t.use("a", far, time.time())  # the oldest was forgotten
    assert not t.use("d", far, time.time())


def test_jti_tracker_drops_expired_entries_early():
    t = JtiTracker(capacity=100)
    now = 1000.0
    t.use("old", now - 100, now)
    t.use("new", now + 100, now)
    assert len(t) == 1


def test_shared_jti_tracker_is_a_bounded_fifo_that_survives_its_process():
    import mmap

    from sentin8.shm.jti import SharedJtiTracker, region_bytes

    mm = mmap.mmap(-1, region_bytes(4), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    t = SharedJtiTracker(memoryview(mm), capacity=4)
    for j in "abcde":
        assert t.use(j, 2e9, 0)
    assert not t.use("e", 2e9, 0) and len(t) == 4
    again = SharedJtiTracker(memoryview(mm), capacity=4)  # a respawned process rebuilds its index from shm
    assert not again.use("b", 2e9, 0) and not again.use("e", 2e9, 0)
    assert again.use("a", 2e9, 0)  # the oldest was overwritten
    assert again.use("f", 2e9, 0) and len(again) == 4


def test_every_refusal_reason_has_a_counter():
    import inspect
    import re as _re

    from sentin8.mgmt import auth
    from sentin8.shm.mgmt_refusals import REFUSAL_REASONS

    raised = set(_re.findall(r'AuthError\(40[13], "([a-z_]+)"\)', inspect.getsource(auth)))
    mapped = {reason for _, reason in auth._REASONS} | {"invalid"}
    assert raised | mapped <= set(REFUSAL_REASONS)
