"""The runtime policy at fleet start: the overlay the management API persisted in ``tls.state_dir``, published
into shared memory before any worker starts, so a restart keeps the operator's runtime changes. An unreadable
overlay is logged and the config file's ``[policy]`` serves."""

from __future__ import annotations

from sentin8 import runtime_policy
from sentin8.eventlog import event
from sentin8.shm.policy import PolicyWriter


def republish_runtime_policy(state_dir: str, writer: PolicyWriter) -> None:
    try:
        overlay = runtime_policy.load(state_dir)
    except runtime_policy.OverlayError as exc:
        event("runtime_policy_unreadable", "error", reason=str(exc), using="config file [policy]")
        return
    writer.publish(overlay)
    if overlay != runtime_policy.Overlay():
        event("runtime_policy_loaded", overlay=runtime_policy.encode(overlay).decode())
