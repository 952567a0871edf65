"""Cluster mode's ticket-key syncer: makes this fleet's session-ticket ratchet the cluster's (docs/cluster.md).

It runs in the resolver process, the only child that holds the operator secret (``cluster.secret_env``): it reads
the wrapped state from Valkey, unwraps it (``sentin8.cluster.ticket_state``) and ``install``s the previous,
current and announced-next secrets in the shared-memory ring the workers seal with. Workers never wait on it:
they ratchet on their own from whatever the ring holds, so a syncer that is late or cut off costs cross-host
resumptions (full handshakes), never a handshake.

The first host finds no state and writes its own ring's current secret with ``SET NX`` (its tickets issued so far
stay valid); a host that loses that race, or comes later, adopts the winner's. During the epoch before a reseed
any host that sees it unannounced publishes one (compare-and-set: one winner, the others adopt it). A state that
does not unwrap (another secret, tampered) is never overwritten: the host stays local and says why.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from sentin8.aio_deadline import honour_cancel, within
from sentin8.cluster import ticket_state
from sentin8.cluster.ticket_state import TicketState, UnwrapError
from sentin8.config import Config
from sentin8.eventlog import event
from sentin8.shm.cluster import ClusterStatus
from sentin8.ticketkeys import TicketKeyRing

FIRST_TIMEOUT_S = 1.0  # the resolver's first attempt, before it loads routes: a dead Valkey delays it this much
RETRY_S = 1.0

# Replace the state only if it is still the one read: two hosts announcing at once, one wins.
_CAS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


class TicketSync:
    def __init__(self, cfg: Config, ring: TicketKeyRing, status: ClusterStatus, secret: bytes) -> None:
        self.target = cfg.cluster_valkey()  # one key: a cluster-mode Valkey routes it to one node
        self.cluster_id = cfg.cluster.cluster_id
        self.node_id = cfg.cluster_node_id()
        self.key = ticket_state.state_key(self.cluster_id)
        self.kek = ticket_state.derive_kek(secret, self.cluster_id)
        self.ring = ring
        self.status = status
        self.rotation_s = ring.rotation_s
        self.poll_s = min(2.0, self.rotation_s / 12)  # several reads per epoch: an announcement is seen in time
        self.timeout_s = 2.0
        self.adopted: TicketState | None = None  # the cluster's state as last read (None: local keys)
        self._client: Any = None
        self._cas: Any = None
        self._complaint = ""

    def _valkey(self) -> Any:
        if self._client is None:
            from sentin8 import valkey_client

            # every valkey_mode; no client-side retry: a failure shows at once, the next cycle retries
            self._client = valkey_client.connect(
                self.target, connect_timeout_s=self.timeout_s, timeout_s=self.timeout_s
            )
            self._cas = self._client.register_script(_CAS)
        return self._client

    async def _drop(self) -> None:
        from sentin8 import valkey_client

        client, self._client, self._cas = self._client, None, None
        await valkey_client.close(client)  # never raises

    def _local_state(self, epoch: int) -> TicketState:
        """This fleet's own ring as a state (what the first host publishes)."""
        self.ring.keys()  # ratchets the ring to the clock first if it is behind
        slots = self.ring.slots()
        if epoch in slots:
            return TicketState(epoch, slots[epoch])
        return TicketState(epoch, os.urandom(32))

    async def cycle(self) -> None:
        """Read (or create), unwrap, announce when due, install. Raises Valkey's errors (``run`` retries)."""
        client = self._valkey()
        epoch = self.ring.epoch()
        blob = await within(client.get(self.key), self.timeout_s)
        if blob is None:
            mine = ticket_state.wrap(self.kek, self.cluster_id, self._local_state(epoch))
            if await within(client.set(self.key, mine, nx=True), self.timeout_s):
                blob = mine
                event("cluster_tickets_created", node_id=self.node_id, epoch=epoch)
            else:
                blob = await within(client.get(self.key), self.timeout_s)
                if blob is None:
                    return  # deleted between the two: next cycle
        try:
            state = ticket_state.unwrap(self.kek, self.cluster_id, blob)
        except UnwrapError as exc:
            self._go_local(str(exc))
            return
        if ticket_state.too_old(state, epoch):
            fresh = ticket_state.wrap(self.kek, self.cluster_id, self._local_state(epoch))
            await within(self._cas(keys=[self.key], args=[blob, fresh]), self.timeout_s)
            return  # the next cycle adopts whichever state won
        if state.epoch == epoch + 1:
            return  # created by a host whose clock just crossed into the next epoch: ours follows in ms
        if state.epoch > epoch:
            self._go_local(f"the cluster's ticket state is at epoch {state.epoch}, this host's clock at {epoch}")
            return
        announced = ticket_state.announce(state, epoch, self.rotation_s, os.urandom(32))
        if announced is not None:
            new = ticket_state.wrap(self.kek, self.cluster_id, announced)
            if await within(self._cas(keys=[self.key], args=[blob, new]), self.timeout_s):
                state = announced
                event("cluster_tickets_reseed_announced", node_id=self.node_id, reseed_epoch=announced.reseed_at)
            else:
                return  # another host announced first: adopt its state next cycle (soon: poll_s)
        self._adopt(state, epoch)

    def _adopt(self, state: TicketState, epoch: int) -> None:
        wanted = ticket_state.secrets(state, epoch)
        have = self.ring.slots()
        if any(have.get(e) != s for e, s in wanted.items()):
            self.ring.install(wanted)
        if self.adopted is None or not self.status.tickets_shared:
            event("cluster_tickets", ticket_keys="shared", node_id=self.node_id, epoch=epoch)
        self.adopted = state
        self._complaint = ""
        self.status.set_tickets_shared(True)

    def _go_local(self, reason: str) -> None:
        self.adopted = None
        self.status.set_tickets_shared(False)
        if reason != self._complaint:
            self._complaint = reason
            event("cluster_tickets", "error", ticket_keys="local", node_id=self.node_id, reason=reason)

    def expire(self) -> None:
        """Valkey unreachable: the adopted state is still the cluster's until a reseed this host was not told of."""
        if self.adopted is not None and self.ring.epoch() > ticket_state.valid_through(self.adopted, self.rotation_s):
            self._go_local("a reseed passed while Valkey was unreachable")

    async def first(self) -> None:
        """One attempt before the resolver loads routes: workers then start with the cluster's keys."""
        try:
            await within(self.cycle(), FIRST_TIMEOUT_S)
        except Exception as exc:
            await self._lost(exc)

    async def _lost(self, exc: BaseException) -> None:
        self.expire()
        if self.adopted is None and self._complaint != "unreachable":
            self._complaint = "unreachable"
            event(
                "cluster_tickets",
                "warning",
                ticket_keys="local",
                node_id=self.node_id,
                reason="Valkey unreachable: tickets resume on this host only",
                error=type(exc).__name__,
            )
        await self._drop()

    async def run(self) -> None:
        try:
            while True:
                await asyncio.sleep(self.poll_s if self.adopted is not None else RETRY_S)
                try:
                    await self.cycle()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # Valkey's errors, timeouts: retried
                    await self._lost(exc)
                honour_cancel()
        finally:
            await self._drop()


def make(cfg: Config, shared: Any, secret: bytes) -> TicketSync | None:
    """The syncer when cluster mode is on and the secret reached this process, else None."""
    if not cfg.cluster.enabled or not secret:
        return None
    return TicketSync(cfg, shared.ticket_keys(), shared.cluster_status(), secret)
