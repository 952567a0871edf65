"""The operator dashboard (``dashboard.html`` beside this module): one self-contained page, no CDN, no
build step, served at ``GET /``.

It holds no data: it asks for a token once (kept in sessionStorage, so it dies with the tab), then polls
``/health``, ``/stats`` and ``/backends`` every 2 s and derives rates and latency quantiles from two samples of
the cumulative counters. Per-service rows come from ``/stats``'s ``services`` (issue #9's per-service counters);
until they exist, one row shows the fleet's totals.
"""

from importlib import resources

DASHBOARD_HTML = resources.files(__package__).joinpath("dashboard.html").read_text(encoding="utf-8")
