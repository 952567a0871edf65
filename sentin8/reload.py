"""The life of one rolling reload: named states and a checked transition table, no I/O.

The supervisor holds at most one running reload and at most one queued behind it; none when idle. A
reload is in exactly one ``ReloadState``; ``_to`` is the only place it changes, and it refuses a transition
the table does not list (a bug caught where it happens, not in a ``reload --wait`` that never returns):

    state         what is going on                                              next
    QUEUED        a SIGHUP came during another reload; later ones coalesce here  CHECKING FAILED
    CHECKING      the config is read and checked (files, listeners, rule set)     REPLACING WAITING_SLOT DONE
                                                                                  REFUSED FAILED
    REPLACING     one worker's replacement is starting; the next waits for it    REPLACING WAITING_SLOT DONE
                  to listen (then the old one is told to drain)                   FAILED
    WAITING_SLOT  every counter slot is held by a draining worker: the next      REPLACING WAITING_SLOT FAILED
                  retiree's exit lets the roll go on
    DONE          every index runs the new config                                -
    REFUSED       the new config was not applied: the old one keeps serving       -
    FAILED        a replacement died or never listened, or the fleet stops        -

``seq`` is the highest SIGHUP count the reload covers: a queued reload reads the config after all the
SIGHUPs it coalesced, so the waiter of any of them is answered by it. A worker recycled for its memory is a
reload with ``seq == 0``: it rolls the same way but has no waiter and reports nothing.
"""

from __future__ import annotations

from enum import IntEnum


class ReloadState(IntEnum):
    QUEUED = 0
    CHECKING = 1
    REPLACING = 2
    WAITING_SLOT = 3
    DONE = 4
    REFUSED = 5
    FAILED = 6


QUEUED, CHECKING, REPLACING, WAITING_SLOT, DONE, REFUSED, FAILED = ReloadState

TRANSITIONS: dict[ReloadState, frozenset[ReloadState]] = {
    QUEUED: frozenset({CHECKING, FAILED}),
    CHECKING: frozenset({REPLACING, WAITING_SLOT, DONE, REFUSED, FAILED}),
    REPLACING: frozenset({REPLACING, WAITING_SLOT, DONE, FAILED}),
    WAITING_SLOT: frozenset({REPLACING, WAITING_SLOT, FAILED}),
    DONE: frozenset(),
    REFUSED: frozenset(),
    FAILED: frozenset(),
}
ENDED = frozenset({DONE, REFUSED, FAILED})


class ReloadStateError(RuntimeError):
    """A transition the table does not list: a bug in the supervisor's reload driving."""


class Spawn:
    """``advance``'s answer: start the replacement of worker ``index`` now."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"Spawn({self.index})"


class RollingReload:
    """One reload, from its SIGHUP to its result. The supervisor does the I/O this object asks for
    (``advance`` says which worker to replace next) and reports back what happened (``replacement_*``).

    Invariant: at most one replacement is starting at a time (``replacing`` has at most one entry, and only
    in REPLACING); ``queue`` holds the worker indices still to replace, in order.
    """

    def __init__(self, seq: int, now: float, *, queued: bool = False) -> None:
        self.seq = seq
        self.state = QUEUED if queued else CHECKING
        self.started = now
        self.queue: list[int] = []
        self.replacing: dict[int, int] = {}  # the starting replacement's pid -> the pid it replaces (-1: none)
        self.reason = ""

    def __repr__(self) -> str:
        return f"RollingReload(seq={self.seq}, {self.state.name}, queue={self.queue}, replacing={self.replacing})"

    def _to(self, new: ReloadState) -> None:
        if new not in TRANSITIONS[self.state]:
            raise ReloadStateError(f"reload {self.seq}: {self.state.name} -> {new.name} is not a transition")
        self.state = new

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def recycle(self) -> bool:
        """A worker replaced for its memory, not an operator's reload: nobody waits for it."""
        return self.seq == 0

    # ---- the operator's side -------------------------------------------------------------------------

    def coalesce(self, seq: int) -> None:
        """Another SIGHUP while this one waits its turn: this reload covers it too."""
        if self.state is not QUEUED:
            raise ReloadStateError(f"reload {self.seq}: only a queued reload coalesces, not {self.state.name}")
        self.seq = max(self.seq, seq)

    def begin(self, now: float) -> None:
        """The reload ahead has ended: this one reads the config now."""
        self._to(CHECKING)
        self.started = now

    def refuse(self, reason: str) -> None:
        self._to(REFUSED)
        self.reason = reason

    def fail(self, reason: str) -> None:
        """Ends a reload that has not ended (the fleet stops, a replacement died); queued ones too."""
        self._to(FAILED)
        self.queue.clear()
        self.replacing.clear()
        self.reason = reason

    def plan(self, indices: list[int]) -> None:
        """The checked config is applied: these workers get replaced, one at a time."""
        if self.state is not CHECKING:
            raise ReloadStateError(f"reload {self.seq}: planned in {self.state.name}")
        self.queue = list(indices)

    def add(self, index: int) -> None:
        """One more worker to replace in this roll (a memory recycle joining it)."""
        if self.ended or self.state is QUEUED:
            raise ReloadStateError(f"reload {self.seq}: cannot add a worker in {self.state.name}")
        if index not in self.queue:
            self.queue.append(index)

    # ---- the roll ------------------------------------------------------------------------------------

    def advance(self, slot_free: bool) -> Spawn | None:
        """What to do next, given whether a counter slot is free: ``Spawn(i)`` (then ``replacement_started``),
        or None: the reload waits (a replacement starting, or no slot) or has just ended (DONE)."""
        if self.ended or self.replacing:
            return None
        if not self.queue:
            self._to(DONE)
            return None
        if not slot_free:
            self._to(WAITING_SLOT)
            return None
        self._to(REPLACING)
        return Spawn(self.queue.pop(0))

    def replacement_started(self, new_pid: int, old_pid: int) -> None:
        if self.state is not REPLACING or self.replacing:
            raise ReloadStateError(f"reload {self.seq}: a replacement started in {self.state.name}")
        self.replacing[new_pid] = old_pid

    def is_replacement(self, pid: int) -> bool:
        return pid in self.replacing

    def replacement_listening(self, pid: int) -> int:
        """The replacement listens: returns the pid it replaces (-1: a new index) for the caller to retire."""
        return self.replacing.pop(pid)

    def replacement_died(self, pid: int, reason: str) -> None:
        """A replacement exited before listening: the reload failed, the old worker keeps serving."""
        self.replacing.pop(pid)
        self.fail(reason)
