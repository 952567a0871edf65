"""The fleet's shared memory as one object: built once by the supervisor from config, inherited by children."""

from __future__ import annotations

from ..config import Config
from . import counters, services, snapshot
from .ratelimit import BucketTable
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
        self.services = cfg.shm.metrics_services
        self.region.reserve("counters", counters.region_bytes(worker_slots, self.services))
        self.region.reserve("services", services.region_bytes(self.services))
        self.ratelimit_slots = cfg.shm.ratelimit_slots
        self.region.reserve("ratelimit", ratelimit_bytes(self.ratelimit_slots))
        self.region.allocate()
        self.service_names().initialize()
        self.ratelimit_lock_fd = BucketTable.make_lock_fd()

    def snapshot_writer(self) -> snapshot.SnapshotWriter:
        return snapshot.SnapshotWriter(self.region.view("snapshot"), self.snapshot_capacity)

    def snapshot_reader(self) -> snapshot.SnapshotReader:
        return snapshot.SnapshotReader(self.region.view("snapshot"), self.snapshot_capacity)

    def suspects(self) -> SuspectTable:
        return SuspectTable(self.region.view("suspects"), self.suspect_slots)

    def worker_counters(self, slot: int) -> counters.WorkerCounters:
        return counters.WorkerCounters(self.region.view("counters"), slot, self.services)

    def counter_reader(self) -> counters.CounterReader:
        return counters.CounterReader(self.region.view("counters"), self.worker_slots, self.services)

    def service_names(self) -> services.ServiceNames:
        return services.ServiceNames(self.region.view("services"), self.services)

    def buckets(self) -> BucketTable:
        return BucketTable(self.region.view("ratelimit"), self.ratelimit_slots, self.ratelimit_lock_fd)
