"""Traffic metrics: what the shared counters mean (status slots, latency buckets, reasons and kinds), the
``stat:metrics`` document built from two readings, its publisher, and the Prometheus exposition.

Counts, statuses and timings only: nothing here ever sees a payload byte, header value, path or query.
"""
