"""The fleet's own state in shared memory, written by the supervisor only, read by the management process:
whether the fleet is starting, serving or draining, and how many workers listen. ``/health`` answers from it,
so a load balancer sees ``draining`` the moment the supervisor starts a drain."""

from __future__ import annotations

STARTING, RUNNING, DRAINING = 0, 1, 2
STATE_NAMES = {STARTING: "starting", RUNNING: "running", DRAINING: "draining"}
_STATE, _WORKERS, _WORKERS_WANTED = 0, 1, 2
WORDS = 8


def region_bytes() -> int:
    return WORDS * 8


class FleetState:
    def __init__(self, view: memoryview) -> None:
        self._w = view.cast("Q")

    def publish(self, state: int, workers_listening: int, workers_wanted: int) -> None:
        w = self._w
        if w[_WORKERS] != workers_listening:
            w[_WORKERS] = workers_listening
        if w[_WORKERS_WANTED] != workers_wanted:
            w[_WORKERS_WANTED] = workers_wanted
        if w[_STATE] != state:
            w[_STATE] = state

    @property
    def state(self) -> str:
        return STATE_NAMES.get(self._w[_STATE], "starting")

    @property
    def workers_listening(self) -> int:
        return self._w[_WORKERS]

    @property
    def workers_wanted(self) -> int:
        return self._w[_WORKERS_WANTED]
