"""Metrics: the Prometheus exposition (the management port's /metrics) and the fleet's published document."""
