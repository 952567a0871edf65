"""A small edge WAF (sans-IO): SQL injection, XSS and path traversal shapes in the request target.

Deliberately narrow — the request target only (path and query, percent-decoded up to twice to catch double
encoding), never bodies — so it is cheap per request and its false positives are easy to reason about. Off by
default (``policy.waf``), as the v1 posture says.
"""

from __future__ import annotations

import re
from urllib.parse import unquote_plus

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "path_traversal",
        re.compile(r"(?:^|[/\\])\.\.(?:[/\\]|$)|/etc/(?:passwd|shadow)|\x00", re.I),
    ),
    (
        "sqli",
        re.compile(
            r"\bunion\b[\s(]+(?:all\s+)?select\b|\bselect\b.+\bfrom\b\s+\w|'\s*(?:or|and)\s+'?\w+'?\s*=\s*'?\w+"
            r"|\b(?:or|and)\s+\d+\s*=\s*\d+|;\s*(?:drop|delete|insert|update|shutdown)\b|\bsleep\s*\(\s*\d"
            r"|\bbenchmark\s*\(|\bwaitfor\s+delay\b|'\s*;?\s*--|/\*.*\*/",
            re.I,
        ),
    ),
    (
        "xss",
        re.compile(
            r"<\s*script\b|javascript\s*:|\bon(?:error|load|mouseover|focus|click)\s*=|<\s*iframe\b|<\s*svg\b", re.I
        ),
    ),
)


def _decoded(target: str) -> list[str]:
    once = unquote_plus(target)
    twice = unquote_plus(once)
    return [target, once] if once == twice else [target, once, twice]


def inspect(target: bytes) -> str | None:
    """The rule that matches the request target (``/path?query``), or None."""
    text = target.decode("latin-1")
    for form in _decoded(text):
        for name, rule in _RULES:
            if rule.search(form):
                return name
    return None
