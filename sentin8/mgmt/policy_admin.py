"""Runtime policy changes: validate, persist in ``tls.state_dir``, then publish to every worker via shm.

Persist first, publish second: a change the workers apply is always one that survives a restart, so a
change that cannot be saved (a full or read-only ``tls.state_dir``) is not applied either: ``NotSaved``,
which the API answers with 503 and the reason. The management process is the only writer while the fleet
runs (the supervisor publishes once at boot).

In cluster mode (``sentin8/mgmt/policy_sync.py``) a local change is also published through Valkey, and a newer
cluster version is adopted here, through the same lock, file and shared-memory writer: ``version`` says which
cluster publication the overlay is (``GET /policy`` shows it).
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec

from .. import runtime_policy
from ..cluster import policy_doc
from ..config import Policy
from ..shm.policy import PolicyReader, PolicyWriter


class NotSaved(Exception):
    """The overlay could not be persisted: nothing was published. ``reason`` is one ``key: reason`` line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class PolicyAdmin:
    def __init__(self, base: Policy, state_dir: str, reader: PolicyReader, writer: PolicyWriter) -> None:
        self.base = base
        self.state_dir = state_dir
        self._reader = reader
        self._writer = writer
        self._lock = threading.Lock()  # one change at a time, even if the app ever runs handlers in threads
        self.version = policy_doc.load_version(state_dir)
        self.unshared = False  # a local change not yet published to the cluster (cluster mode)

    def _view(self, overlay: runtime_policy.Overlay, generation: int) -> dict[str, Any]:
        eff = runtime_policy.effective(self.base, overlay)
        return {
            "effective": {k: getattr(eff, k) for k in runtime_policy.RUNTIME_KEYS},
            "overlay": msgspec.to_builtins(overlay),
            "config": {k: getattr(self.base, k) for k in runtime_policy.RUNTIME_KEYS},
            "generation": generation,
            "version": self.version.version,  # the cluster publication this is (0 = never shared)
            "set_by": self.version.node,
            "unshared": self.unshared,
        }

    def _save(self, overlay: runtime_policy.Overlay) -> None:
        try:
            runtime_policy.save(self.state_dir, overlay)
        except OSError as exc:
            reason = f"tls.state_dir: cannot save the policy in {self.state_dir} ({exc.strerror}): not applied"
            raise NotSaved(reason) from None

    def get(self) -> dict[str, Any]:
        gen, overlay = self._reader.read()
        return self._view(overlay, gen)

    def change(self, body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """(the new view, the checked changes); OverlayError for a 422."""
        changes = runtime_policy.validate_changes(body)
        with self._lock:
            _, overlay = self._reader.read()
            new = runtime_policy.apply(overlay, changes)
            self._save(new)
            gen = self._writer.publish(new)
            self.unshared = True
        return self._view(new, gen), changes

    def reset(self) -> dict[str, Any]:
        """Back to the config file's values."""
        with self._lock:
            empty = runtime_policy.Overlay()
            self._save(empty)
            gen = self._writer.publish(empty)
            self.unshared = True
        return self._view(empty, gen)

    def overlay(self) -> runtime_policy.Overlay:
        return self._reader.read()[1]

    def adopt(self, overlay: runtime_policy.Overlay, version: policy_doc.Version) -> bool:
        """Take the cluster's overlay (newer than ours); False when a local change came first (it is published
        next, and wins as the later writer)."""
        with self._lock:
            if self.unshared:
                return False
            runtime_policy.save(self.state_dir, overlay)
            self._writer.publish(overlay)
            self.version = version
            policy_doc.save_version(self.state_dir, version)
            return True

    def shared(self, overlay: runtime_policy.Overlay, version: policy_doc.Version) -> None:
        """``overlay`` was published as ``version``: unless it changed again meanwhile, ours is that version."""
        with self._lock:
            if self._reader.read()[1] == overlay:
                self.unshared = False
            self.version = version
            policy_doc.save_version(self.state_dir, version)
