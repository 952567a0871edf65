"""Runtime policy across hosts (cluster mode): the management process publishes its changes through Valkey and
adopts every newer version another host publishes (``sentin8/cluster/policy_doc.py`` has the document and the
rule). The overlay stays on disk as without cluster mode, so a host that starts while Valkey is down enforces
the last policy it knew, and adopts the cluster's once Valkey answers.

One task in the management process, the overlay's only writer (``PolicyAdmin``): it listens on the change
channel and re-reads the document at least every ``POLL_S`` (a missed notification costs at most that), so a
change on any host is enforced everywhere within ~1 s. A ``PUT``/``DELETE`` publishes at once (bounded by
``PUSH_TIMEOUT_S``, never failing the request: an unpublished change is retried by the task).
"""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

from .. import runtime_policy
from ..aio_deadline import honour_cancel, within
from ..cluster import policy_doc
from ..config import ValkeyTarget
from ..eventlog import event
from .policy_admin import PolicyAdmin

POLL_S = 0.5
PUSH_TIMEOUT_S = 0.5
RETRY_S = 1.0


class PolicySync:
    def __init__(self, admin: PolicyAdmin, target: ValkeyTarget | str, cluster_id: str, node_id: str) -> None:
        self.admin = admin
        self.target = ValkeyTarget(target) if isinstance(target, str) else target  # a str: one server's URL
        self.key = policy_doc.doc_key(cluster_id)
        self.channel = policy_doc.channel(cluster_id)
        self.node_id = node_id
        self._client: Any = None
        self._publish: Any = None
        self._lock = asyncio.Lock()  # one reconcile or push at a time
        self.reachable = False

    def _valkey(self) -> Any:
        if self._client is None:
            from .. import valkey_client

            self._client = valkey_client.connect(
                self.target, connect_timeout_s=PUSH_TIMEOUT_S, timeout_s=PUSH_TIMEOUT_S
            )
            self._publish = self._client.register_script(policy_doc.PUBLISH)
        return self._client

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            from .. import valkey_client

            await valkey_client.close(client)

    async def push(self) -> None:
        """Publish the current overlay as the cluster's newest version (after a local change)."""
        async with self._lock:
            await self._push()

    async def _push(self) -> None:
        overlay = self.admin.overlay()
        self._valkey()
        v, lineage = await within(
            self._publish(
                keys=[self.key, self.channel],
                args=[runtime_policy.encode(overlay), self.node_id, secrets.token_hex(8)],
            ),
            PUSH_TIMEOUT_S,
        )
        version = policy_doc.Version(
            int(v), lineage.decode() if isinstance(lineage, bytes) else str(lineage), self.node_id
        )
        self.admin.shared(overlay, version)
        event("policy_shared", version=version.version, node_id=self.node_id)

    async def reconcile(self) -> None:
        """Adopt a newer cluster version, or publish what only this host knows."""
        async with self._lock:
            if self.admin.unshared:
                await self._push()
                return
            fields = await within(self._valkey().hgetall(self.key), PUSH_TIMEOUT_S)
            remote = policy_doc.parse(fields)
            local = self.admin.version
            if policy_doc.adopt(local, remote):
                assert remote is not None
                try:
                    overlay = runtime_policy.decode(remote.overlay)
                except (ValueError, runtime_policy.OverlayError) as exc:
                    event("policy_remote_invalid", "error", version=remote.version.version, reason=str(exc)[:200])
                    return
                if self.admin.adopt(overlay, remote.version):
                    event(
                        "policy_adopted",
                        version=remote.version.version,
                        set_by=remote.version.node,
                        overlay=runtime_policy.encode(overlay).decode(),
                    )
            elif policy_doc.should_seed(local, remote, self.admin.overlay() != runtime_policy.Overlay()):
                await self._push()

    async def run(self) -> None:
        event("policy_sync_start", channel=self.channel, node_id=self.node_id)
        try:
            while True:
                pubsub = None
                try:
                    pubsub = self._valkey().pubsub()
                    await within(pubsub.subscribe(self.channel), PUSH_TIMEOUT_S)
                    while True:
                        await self.reconcile()
                        if not self.reachable:
                            self.reachable = True
                            event("policy_sync", state="connected")
                        # a notification, or the poll's deadline: reconcile either way
                        await pubsub.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
                        honour_cancel()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Valkey unreachable: the local overlay keeps being enforced
                    if self.reachable:
                        self.reachable = False
                        event("policy_sync", "warning", state="unreachable", error=type(exc).__name__)
                    if pubsub is not None:
                        try:
                            await pubsub.aclose()
                        except Exception:
                            pass
                    await self._drop()
                    await asyncio.sleep(RETRY_S)
        finally:
            await self._drop()
