"""The fleet's shared memory as one object: built once by the supervisor from config, inherited by children."""

from __future__ import annotations

from ..breaker import BreakerRules
from ..config import Config
from ..ticketkeys import TicketKeyRing
from . import certreport, counters, mgmt_refusals, services, snapshot
from . import cluster as cluster_state
from . import fleet as fleet_state
from . import jti as jti_region
from . import policy as policy_region
from .breakers import BreakerTable
from .breakers import region_bytes as breaker_bytes
from .conncap import ConnectionCounts
from .conncap import region_bytes as conncap_bytes
from .ratelimit import BucketTable, moved_region_bytes
from .ratelimit import region_bytes as ratelimit_bytes
from .region import SharedRegion
from .suspects import SuspectTable


class SharedState:
    def __init__(self, cfg: Config, worker_slots: int) -> None:
        self.snapshot_capacity = cfg.shm.snapshot_bytes
        self.suspect_slots = cfg.shm.suspect_slots
        self.worker_slots = worker_slots
        self.region = SharedRegion()
        self.region.reserve("snapshot", snapshot.region_bytes(self.snapshot_capacity))
        self.region.reserve("suspects", SuspectTable.region_bytes(self.suspect_slots))
        self.breaker_slots = cfg.shm.breaker_slots
        self.region.reserve("breakers", breaker_bytes(self.breaker_slots))
        self.conncap_slots = cfg.shm.conncap_slots
        self.region.reserve("conncap", conncap_bytes(self.conncap_slots, worker_slots))
        self.services = cfg.shm.metrics_services
        self.tls_dirs = (cfg.tls.cert_dir, cfg.tls.state_dir)  # the mgmt process reads certificate expiry there
        self.region.reserve("counters", counters.region_bytes(worker_slots, self.services))
        self.region.reserve("services", services.region_bytes(self.services))
        self.ratelimit_slots = cfg.shm.ratelimit_slots
        self.region.reserve("ratelimit", ratelimit_bytes(self.ratelimit_slots))
        # cluster mode: the moved queues the limiter's syncer reads (docs/cluster.md); fixed at start
        self.cluster_enabled = cfg.cluster.enabled
        if self.cluster_enabled:
            self.region.reserve("ratelimit_moved", moved_region_bytes(self.ratelimit_slots))
        self.region.reserve("cluster", cluster_state.region_bytes())
        self.region.reserve("policy", policy_region.region_bytes())
        self.region.reserve("fleet", fleet_state.region_bytes())
        self.region.reserve("jti", jti_region.region_bytes())
        self.region.reserve("mgmt_refusals", mgmt_refusals.region_bytes())
        self.region.reserve("ticketkeys", TicketKeyRing.REGION_BYTES)
        self.region.reserve("certreport", certreport.region_bytes(worker_slots))
        self.region.allocate()
        self.service_names().initialize()
        self.ticket_key_rotation_s = cfg.tls.ticket_key_rotation_s
        # Built before the supervisor forks: every worker, respawned ones too, seals tickets with these keys.
        self.ticket_keys().seed()
        self.ratelimit_lock_fd = BucketTable.make_lock_fd()

    def snapshot_writer(self) -> snapshot.SnapshotWriter:
        return snapshot.SnapshotWriter(self.region.view("snapshot"), self.snapshot_capacity)

    def snapshot_reader(self) -> snapshot.SnapshotReader:
        return snapshot.SnapshotReader(self.region.view("snapshot"), self.snapshot_capacity)

    def suspects(self) -> SuspectTable:
        return SuspectTable(self.region.view("suspects"), self.suspect_slots)

    def breakers(self, rules: BreakerRules) -> BreakerTable:
        return BreakerTable(self.region.view("breakers"), self.breaker_slots, rules)

    def connection_counts(self, slot: int | None) -> ConnectionCounts:
        """``slot``: the worker slot that writes; None for a reader (the supervisor)."""
        return ConnectionCounts(self.region.view("conncap"), self.conncap_slots, self.worker_slots, slot)

    def worker_counters(self, slot: int) -> counters.WorkerCounters:
        return counters.WorkerCounters(self.region.view("counters"), slot, self.services)

    def counter_reader(self) -> counters.CounterReader:
        names = self.service_names()
        return counters.CounterReader(self.region.view("counters"), self.worker_slots, self.services, names.count)

    def service_names(self) -> services.ServiceNames:
        return services.ServiceNames(self.region.view("services"), self.services)

    def buckets(self) -> BucketTable:
        moved = self.region.view("ratelimit_moved") if self.cluster_enabled else None
        return BucketTable(self.region.view("ratelimit"), self.ratelimit_slots, self.ratelimit_lock_fd, moved)

    def cluster_status(self) -> cluster_state.ClusterStatus:
        return cluster_state.ClusterStatus(self.region.view("cluster"))

    def cluster_health(self) -> dict[str, object]:
        """The ``cluster`` field of ``GET /health``."""
        status = self.cluster_status()
        return {
            "enabled": self.cluster_enabled,
            "limiter": status.limiter if self.cluster_enabled else "local",
            "ticket_keys": "shared" if self.cluster_enabled and status.tickets_shared else "local",
            "hosts_seen": status.hosts_seen if self.cluster_enabled else 1,
        }

    def policy_writer(self) -> policy_region.PolicyWriter:
        return policy_region.PolicyWriter(self.region.view("policy"))

    def policy_reader(self) -> policy_region.PolicyReader:
        return policy_region.PolicyReader(self.region.view("policy"))

    def fleet(self) -> fleet_state.FleetState:
        return fleet_state.FleetState(self.region.view("fleet"))

    def jti_tracker(self) -> jti_region.SharedJtiTracker:
        """For the management process only (the one writer)."""
        return jti_region.SharedJtiTracker(self.region.view("jti"))

    def mgmt_refusals(self) -> mgmt_refusals.RefusalCounters:
        """Management-API refusals by reason (written by the management process only)."""
        return mgmt_refusals.RefusalCounters(self.region.view("mgmt_refusals"))

    def ticket_keys(self) -> TicketKeyRing:
        return TicketKeyRing(self.region.view("ticketkeys"), self.ticket_key_rotation_s)

    def cert_report_writer(self, slot: int) -> certreport.CertReportWriter:
        return certreport.CertReportWriter(self.region.view("certreport"), slot)

    def rejected_certificates(self) -> dict[str, dict[str, object]]:
        """Store certificates present but rejected, per store directory name, with the reason: for /health."""
        return certreport.read_rejected(self.region.view("certreport"), self.worker_slots)

    def tls_health(self) -> dict[str, object]:
        """The ``tls`` field of ``GET /health`` (no secrets): store certificates present but rejected, with
        the reason each worker found, and the session-ticket rotation period the fleet runs with."""
        rejected = self.rejected_certificates()
        return {
            "certificates_rejected": len(rejected),
            "rejected": rejected,
            "ticket_key_rotation_s": self.ticket_key_rotation_s,
        }
