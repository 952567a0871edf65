"""The rolling reload's state machine (sentin8/reload.py), without processes: only the table's transitions
happen, and the queued and slot-waiting paths end where they should."""

from __future__ import annotations

import itertools

import pytest

from sentin8.reload import (
    CHECKING,
    DONE,
    ENDED,
    FAILED,
    QUEUED,
    REFUSED,
    REPLACING,
    TRANSITIONS,
    WAITING_SLOT,
    ReloadState,
    ReloadStateError,
    RollingReload,
    Spawn,
)


def test_the_table_names_every_state_and_ended_states_lead_nowhere():
    assert set(TRANSITIONS) == set(ReloadState)
    for state in ENDED:
        assert TRANSITIONS[state] == frozenset()
    assert {DONE, REFUSED, FAILED} == ENDED


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(ReloadState, ReloadState)))
def test_only_listed_transitions_happen(src, dst):
    reload = RollingReload(1, 0.0)
    reload.state = src
    if dst in TRANSITIONS[src]:
        reload._to(dst)
        assert reload.state is dst
    else:
        with pytest.raises(ReloadStateError):
            reload._to(dst)
        assert reload.state is src


def roll(reload: RollingReload, slots: list[bool]) -> list[str]:
    """Drive ``reload`` like the supervisor: each replacement listens at once; ``slots`` says, call by call,
    whether a counter slot is free. Returns what happened."""
    trace = []
    pid = 100
    for free in slots:
        step = reload.advance(free)
        trace.append(reload.state.name)
        if isinstance(step, Spawn):
            pid += 1
            reload.replacement_started(pid, 10 + step.index)
            assert reload.replacement_listening(pid) == 10 + step.index
        if reload.ended:
            break
    return trace


def test_a_reload_replaces_each_worker_in_turn_then_is_done():
    reload = RollingReload(1, 0.0)
    reload.plan([0, 1, 2])
    assert roll(reload, [True] * 5) == ["REPLACING", "REPLACING", "REPLACING", "DONE"]
    assert reload.queue == [] and reload.replacing == {}


def test_one_replacement_at_a_time():
    reload = RollingReload(1, 0.0)
    reload.plan([0, 1])
    step = reload.advance(True)
    assert isinstance(step, Spawn) and step.index == 0
    reload.replacement_started(7, 3)
    assert reload.advance(True) is None and reload.state is REPLACING  # waits for pid 7 to listen
    with pytest.raises(ReloadStateError):
        reload.replacement_started(8, 4)


def test_the_slot_waiting_path_resumes_when_a_slot_frees():
    reload = RollingReload(1, 0.0)
    reload.plan([0, 1])
    trace = roll(reload, [True, False, False, True, True])
    assert trace == ["REPLACING", "WAITING_SLOT", "WAITING_SLOT", "REPLACING", "DONE"]


def test_a_reload_waiting_for_a_slot_can_fail_but_not_be_done():
    reload = RollingReload(1, 0.0)
    reload.plan([0])
    reload.advance(False)
    assert reload.state is WAITING_SLOT
    with pytest.raises(ReloadStateError):
        reload._to(DONE)
    reload.fail("the fleet is stopping")
    assert reload.state is FAILED and reload.queue == [] and reload.reason == "the fleet is stopping"


def test_the_queued_path_coalesces_then_checks_then_rolls():
    queued = RollingReload(2, 1.0, queued=True)
    assert queued.state is QUEUED
    queued.coalesce(3)
    queued.coalesce(5)
    assert queued.seq == 5  # the one reload covers every SIGHUP that came while it waited
    with pytest.raises(ReloadStateError):
        queued.plan([0])  # a queued reload has not read the config yet
    with pytest.raises(ReloadStateError):
        queued._to(REPLACING)  # nor start replacing
    queued.begin(4.0)
    assert queued.state is CHECKING and queued.started == 4.0
    with pytest.raises(ReloadStateError):
        queued.coalesce(6)  # reading the config already: a later SIGHUP queues a reload of its own
    queued.plan([0])
    assert roll(queued, [True, True]) == ["REPLACING", "DONE"]


def test_a_queued_reload_fails_when_the_fleet_stops():
    queued = RollingReload(2, 1.0, queued=True)
    queued.fail("the fleet is stopping")
    assert queued.state is FAILED
    with pytest.raises(ReloadStateError):
        queued.begin(2.0)


def test_a_refused_reload_never_rolls():
    reload = RollingReload(1, 0.0)
    reload.refuse("listen.https: cannot listen on 0.0.0.0:443: already in use")
    assert reload.state is REFUSED and reload.ended
    assert reload.advance(True) is None and reload.state is REFUSED
    with pytest.raises(ReloadStateError):
        reload.fail("late")


def test_a_replacement_that_dies_fails_the_reload_and_drops_the_rest():
    reload = RollingReload(1, 0.0)
    reload.plan([0, 1, 2])
    reload.advance(True)
    reload.replacement_started(9, 1)
    reload.replacement_died(9, "worker 0: replacement exited 1 before listening")
    assert reload.state is FAILED and reload.queue == [] and not reload.is_replacement(9)
    assert reload.advance(True) is None


def test_a_memory_recycle_is_a_reload_without_a_waiter_and_can_join_a_roll():
    recycle = RollingReload(0, 0.0)
    assert recycle.recycle
    recycle.plan([1])
    recycle.add(1)  # already queued: once
    recycle.add(0)
    assert recycle.queue == [1, 0]
    assert roll(recycle, [True] * 3) == ["REPLACING", "REPLACING", "DONE"]
    with pytest.raises(ReloadStateError):
        recycle.add(2)
