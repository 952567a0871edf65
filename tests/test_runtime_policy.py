"""The runtime policy overlay: validation, merging, persistence, and the shared-memory generation cache."""

from __future__ import annotations

import mmap
import os

import pytest

from sentin8 import runtime_policy as rp
from sentin8.config import Policy
from sentin8.mgmt.policy_admin import PolicyAdmin
from sentin8.shm import policy as shm_policy


def region():
    mm = mmap.mmap(-1, shm_policy.region_bytes(), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    view = memoryview(mm)
    return shm_policy.PolicyReader(view), shm_policy.PolicyWriter(view)


def test_validate_names_the_field():
    assert rp.validate_changes({"waf": True, "rate_limit_rps": 5, "rate_limit_key": None}) == {
        "waf": True, "rate_limit_rps": 5.0, "rate_limit_key": None}
    cases = [
        ({"waf": 1}, "waf"),
        ({"rate_limit": "on"}, "rate_limit"),
        ({"rate_limit_rps": 0}, "rate_limit_rps"),
        ({"rate_limit_burst": float("nan")}, "rate_limit_burst"),
        ({"rate_limit_rps": True}, "rate_limit_rps"),
        ({"rate_limit_key": "x"}, "rate_limit_key"),
        ({"max_headers": 1}, "max_headers"),
        ({}, "body"),
        ("x", "body"),
    ]
    for body, field in cases:
        with pytest.raises(rp.OverlayError) as info:
            rp.validate_changes(body)
        assert info.value.field == field, body


def test_effective_overlays_only_set_fields():
    base = Policy(waf=False, rate_limit_rps=100)
    over = rp.apply(rp.Overlay(), {"waf": True})
    eff = rp.effective(base, over)
    assert eff.waf is True and eff.rate_limit_rps == 100 and eff.max_headers == base.max_headers
    assert rp.effective(base, rp.apply(over, {"waf": None})) == base


def test_persistence_round_trip_and_bad_file(tmp_path):
    assert rp.load(str(tmp_path)) == rp.Overlay()
    over = rp.Overlay(rate_limit=True, rate_limit_rps=2.5)
    rp.save(str(tmp_path), over)
    assert rp.load(str(tmp_path)) == over
    assert [p for p in os.listdir(tmp_path) if p.startswith(".")] == []  # no temp file left behind
    (tmp_path / rp.FILE_NAME).write_text('{"rate_limit_rps": -3}')
    with pytest.raises(rp.OverlayError, match="rate_limit_rps"):
        rp.load(str(tmp_path))


def test_cache_rebuilds_only_when_the_generation_moves():
    reader, writer = region()
    base = Policy()
    cache = shm_policy.PolicyCache(reader, base)
    assert cache.current() is base  # nothing published: the config file's values
    writer.publish(rp.Overlay())
    first = cache.current()
    for _ in range(100):
        assert cache.current() is first
    assert cache.rebuilds == 1
    writer.publish(rp.Overlay(rate_limit=True))
    changed = cache.current()
    assert changed.rate_limit is True and changed is not first and cache.rebuilds == 2
    assert cache.current() is changed and cache.rebuilds == 2


def test_admin_persists_then_publishes_and_resets(tmp_path):
    reader, writer = region()
    admin = PolicyAdmin(Policy(rate_limit_rps=100), str(tmp_path), reader, writer)
    view, changes = admin.change({"rate_limit": True, "rate_limit_rps": 7})
    assert changes == {"rate_limit": True, "rate_limit_rps": 7.0}
    assert view["effective"]["rate_limit_rps"] == 7.0 and view["config"]["rate_limit_rps"] == 100
    assert rp.load(str(tmp_path)) == rp.Overlay(rate_limit=True, rate_limit_rps=7.0)
    assert reader.read()[1] == rp.Overlay(rate_limit=True, rate_limit_rps=7.0)
    view = admin.reset()
    assert view["overlay"] == {} and reader.read()[1] == rp.Overlay() and rp.load(str(tmp_path)) == rp.Overlay()
