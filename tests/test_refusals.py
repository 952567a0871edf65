"""What each refusal counts as (``sentin8.refusals``): one rule, the total always the sum of the kinds."""

from __future__ import annotations

import mmap

import pytest

from sentin8 import refusals
from sentin8.refusals import Refusal, counted_as, for_head_status
from sentin8.shm import counters as c


def _fresh() -> tuple[c.WorkerCounters, c.CounterReader]:
    mm = mmap.mmap(-1, c.region_bytes(1, 0), flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    view = memoryview(mm)
    return c.WorkerCounters(view, 0), c.CounterReader(view, 1)


def _kinds(totals: dict[str, int]) -> dict[str, int]:
    return {k: totals[c.POLICY_PREFIX + k] for k in c.POLICY_KINDS}


@pytest.mark.parametrize("refusal", refusals.ALL, ids=repr)
def test_each_refusal_adds_its_name_and_a_policy_block_adds_its_kind_and_the_total(refusal):
    w, r = _fresh()
    for _ in range(3):
        w.refused(refusal)
    totals = r.total()
    if refusal.name is not None:
        assert totals[refusal.name] == 3
    kinds = _kinds(totals)
    assert totals["policy_blocked"] == sum(kinds.values()) == (3 if refusal.kind else 0)
    if refusal.kind:
        assert kinds[refusal.kind] == 3
    assert sum(totals.values()) == 3 * len(refusal.names)  # nothing else moved


def test_every_refusal_together_keeps_the_total_equal_to_the_sum_of_the_kinds():
    w, r = _fresh()
    for i, refusal in enumerate(refusals.ALL):
        for _ in range(i + 1):
            w.refused(refusal)
    totals = r.total()
    assert totals["policy_blocked"] == sum(_kinds(totals).values()) > 0


def test_every_kind_is_the_kind_of_a_refusal_and_every_refusal_is_listed():
    assert {x.kind for x in refusals.ALL if x.kind} == set(c.POLICY_KINDS)
    defined = {v for v in vars(refusals).values() if isinstance(v, Refusal)}
    assert defined == set(refusals.ALL)


def test_counted_as_is_the_one_rule():
    assert counted_as("refused_inflight", "inflight_cap") == (
        "refused_inflight",
        "policy_block_inflight_cap",
        "policy_blocked",
    )
    assert counted_as("refused_breaker_open", None) == ("refused_breaker_open",)  # no policy block
    assert counted_as(None, "header_caps") == ("policy_block_header_caps", "policy_blocked")
    # a typo shows in the counters, never raises on a connection
    assert counted_as("no_such_counter", "no_such_kind") == ("unknown_counter", "policy_block_other", "policy_blocked")
    assert Refusal(None, "no_such_kind").words == (c.INDEX["policy_block_other"], c.INDEX["policy_blocked"])


@pytest.mark.parametrize(("status", "refusal"), [(431, refusals.HEADER_CAPS), (414, refusals.HEADER_CAPS)])
def test_the_head_caps_are_policy_blocks(status, refusal):
    assert for_head_status(status) is refusal


@pytest.mark.parametrize("status", [400, 405, 408, 413, 501, 505])
def test_a_malformed_head_is_no_policy_block(status):
    assert for_head_status(status) is None


def test_proxy_header_errors_map_to_their_refusals():
    from sentin8 import proxy_protocol

    assert refusals.for_proxy_error("not_proxy") is refusals.PROXY_MISSING
    assert refusals.for_proxy_error("v1") is refusals.PROXY_V1
    assert refusals.for_proxy_error("oversize") is refusals.PROXY_OVERSIZE
    others = set(proxy_protocol.REASONS) - {"not_proxy", "v1", "oversize"}
    assert {refusals.for_proxy_error(r) for r in others} == {refusals.PROXY_MALFORMED}
    assert refusals.PROXY_UNTRUSTED.names == ("proxy_header_untrusted", "policy_block_proxy_source", "policy_blocked")
    assert all(r.kind is None for r in (refusals.PROXY_MISSING, refusals.PROXY_TIMEOUT, refusals.PROXY_TRUNCATED))
