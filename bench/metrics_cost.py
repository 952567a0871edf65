"""What the per-request metric work costs a worker: ``python -m bench.metrics_cost``.

Times, in one process on real shared memory, the calls a worker makes for every answered L7 request
(``request`` + ``upstream`` + ``traffic``, plus the fleet-wide ``inc`` the bridge already made before per-service
metrics) and prints ns per request, median of 5 runs. Compare with the CPU-µs per request of the L7 bench.
"""

from __future__ import annotations

import statistics
import time

from sentin8 import routing
from sentin8.config import load_bytes
from sentin8.shm.state import SharedState


def main() -> None:
    state = SharedState(load_bytes(b""), 4)
    table = routing.build([routing.Route("web.bench.test", "web")], [], time.time())
    table.with_service_ids(state.service_names().assign)
    sidx = table.resolve("web.bench.test").sidx
    w = state.worker_counters(0)
    w.claim(0)
    n = 200_000
    results = {}
    for label, fn in (
        ("inc (the pre-existing per-request counter)", lambda: w.inc("status_2xx")),
        ("request (status + histogram + sum + max)", lambda: w.request(sidx, 200, 0.00123)),
        ("upstream (fleet-wide + per service)", lambda: w.upstream(sidx, "upstream_warm")),
        ("traffic (side)", lambda: w.traffic(True, "requests")),
    ):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter_ns()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter_ns() - t0) / n)
        results[label] = statistics.median(runs)
    for label, ns in results.items():
        print(f"{ns:7.0f} ns  {label}")
    added = sum(v for k, v in results.items() if not k.startswith("inc"))
    print(f"{added:7.0f} ns  added per answered request by per-service metrics")


if __name__ == "__main__":
    main()
