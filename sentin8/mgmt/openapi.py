"""The management API's OpenAPI 3.0 document, written by hand next to the endpoints it describes (a test runs
schemathesis against it and a running fleet, so it cannot drift quietly)."""

from __future__ import annotations

from typing import Any

from ..runtime_policy import RATE_KEYS
from .credentials import SCOPE_BACKENDS, SCOPE_MAPPINGS, SCOPE_POLICY, SCOPE_STATS

_NUM = {"type": "number"}
_NULLABLE_NUM = {"type": "number", "nullable": True}
_ERROR = {
    "type": "object",
    "properties": {
        "error": {"type": "string"},
        "reason": {"type": "string"},
        "detail": {"type": "string"},
        "field": {"type": "string"},
    },
    "required": ["error"],
}
_POLICY_VALUES = {
    "type": "object",
    "properties": {
        "waf": {"type": "boolean"},
        "rate_limit": {"type": "boolean"},
        "rate_limit_rps": _NUM,
        "rate_limit_burst": _NUM,
        "rate_limit_key": {"type": "string", "enum": list(RATE_KEYS)},
    },
}
_POLICY_CHANGE = {
    "type": "object",
    "description": "Keys to change; null sets a key back to the config file's value.",
    "minProperties": 1,
    "additionalProperties": False,
    "properties": {
        "waf": {"type": "boolean", "nullable": True},
        "rate_limit": {"type": "boolean", "nullable": True},
        "rate_limit_rps": {
            "type": "number",
            "exclusiveMinimum": True,
            "minimum": 0,
            "maximum": 1000000,
            "nullable": True,
        },
        "rate_limit_burst": {
            "type": "number",
            "exclusiveMinimum": True,
            "minimum": 0,
            "maximum": 1000000,
            "nullable": True,
        },
        "rate_limit_key": {"type": "string", "enum": [*RATE_KEYS, None], "nullable": True},  # 3.0: null listed
    },
}
_POLICY_VIEW = {
    "type": "object",
    "properties": {
        "effective": _POLICY_VALUES,
        "overlay": _POLICY_VALUES,
        "config": _POLICY_VALUES,
        "generation": {"type": "integer"},
        "version": {"type": "integer", "description": "the cluster publication this overlay is (0 = never shared)"},
        "set_by": {"type": "string", "description": "the host that published that version"},
        "unshared": {"type": "boolean", "description": "a local change not yet published to the cluster"},
    },
    "required": ["effective", "overlay", "config", "generation"],
}
_HEALTH = {
    "type": "object",
    "properties": {
        "status": {"type": "string", "enum": ["ok", "stale", "draining", "starting"]},
        "version": {"type": "string"},
        "snapshot_age_s": _NULLABLE_NUM,
        "stale": {"type": "boolean"},
        "mappings": {"type": "integer"},
        "services": {"type": "integer"},
        "instances": {"type": "object", "additionalProperties": {"type": "integer"}},
        "active_connections": {"type": "integer"},
        "workers": {"type": "integer"},
        "tls": {"type": "object"},
        "cluster": {
            "type": "object",
            "properties": {
                "enabled": {"type": "boolean"},
                "limiter": {"type": "string", "enum": ["local", "global", "local-fallback"]},
                "ticket_keys": {"type": "string", "enum": ["shared", "local"]},
                "hosts_seen": {"type": "integer"},
            },
        },
    },
    "required": [
        "status",
        "version",
        "snapshot_age_s",
        "stale",
        "mappings",
        "services",
        "instances",
        "active_connections",
        "workers",
    ],
}
_INSTANCE = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "host": {"type": "string"},
        "port": {"type": "integer"},
        "state": {"type": "string"},
        "health_age_s": _NULLABLE_NUM,
        "fresh": {"type": "boolean"},
        "suspect": {**_NULLABLE_NUM, "description": "seconds left on a suspect mark, null when not suspect"},
        "tls": {"type": "boolean"},
        "proxy_protocol": {
            "type": "string",
            "enum": ["", "v2"],
            "description": "v2: an L4 pipe to it starts with a PROXY v2 header",
        },
    },
    "required": ["id", "host", "port", "state", "health_age_s", "fresh", "suspect", "tls", "proxy_protocol"],
}
_MAPPING = {
    "type": "object",
    "properties": {
        "hostname": {"type": "string"},
        "service": {"type": "string"},
        "env_id": {"type": "string"},
        "app_id": {"type": "string"},
        "source": {"type": "string"},
        "wildcard": {"type": "boolean"},
    },
    "required": ["hostname", "service", "env_id", "app_id", "source", "wildcard"],
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_DENIED = {
    "401": _json(_ERROR, "missing, invalid, expired or replayed token (WWW-Authenticate: Bearer)"),
    "403": _json(_ERROR, "valid token without the scope"),
}


def _secured(scope: str) -> list[dict[str, list[str]]]:
    return [{"bearer": [scope]}]


def openapi_document(version: str) -> dict[str, Any]:
    policy_responses = {"200": _json(_POLICY_VIEW, "the runtime policy"), **_DENIED}
    return {
        "openapi": "3.0.3",
        "info": {"title": "Sentin8:Proxy management API", "version": version},
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        },
        "paths": {
            "/health": {
                "get": {
                    "summary": "Fleet health for load balancers (no token)",
                    "security": [],
                    "responses": {
                        "200": _json(_HEALTH, "serving (ok or stale)"),
                        "503": _json(_HEALTH, "draining or starting"),
                    },
                }
            },
            "/backends": {
                "get": {
                    "summary": "Every service's instances with state, freshness and suspect marks",
                    "security": _secured(SCOPE_BACKENDS),
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "services": {
                                        "type": "object",
                                        "additionalProperties": {"type": "array", "items": _INSTANCE},
                                    }
                                },
                                "required": ["services"],
                            },
                            "instances by service",
                        ),
                        **_DENIED,
                    },
                }
            },
            "/mappings": {
                "get": {
                    "summary": "Hostname mappings, filtered and paged",
                    "security": _secured(SCOPE_MAPPINGS),
                    "parameters": [
                        {
                            "name": "host",
                            "in": "query",
                            "schema": {"type": "string"},
                            "description": "hostnames containing this text (case-insensitive)",
                        },
                        {"name": "service", "in": "query", "schema": {"type": "string"}},
                        {
                            "name": "limit",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 1000},
                        },
                        {
                            "name": "offset",
                            "in": "query",
                            "schema": {"type": "integer", "minimum": 0, "maximum": 2147483648, "default": 0},
                        },
                    ],
                    "responses": {
                        "200": _json(
                            {
                                "type": "object",
                                "properties": {
                                    "total": {"type": "integer"},
                                    "offset": {"type": "integer"},
                                    "limit": {"type": "integer"},
                                    "mappings": {"type": "array", "items": _MAPPING},
                                },
                                "required": ["total", "mappings"],
                            },
                            "one page of mappings",
                        ),
                        "422": _json(_ERROR, "invalid parameter (field named)"),
                        **_DENIED,
                    },
                }
            },
            "/stats": {
                "get": {
                    "summary": "Cumulative counters for the dashboard (rates come from two samples)",
                    "security": _secured(SCOPE_STATS),
                    "responses": {
                        "200": _json({"type": "object"}, "fleet counters, latency histogram, per service"),
                        **_DENIED,
                    },
                }
            },
            "/policy": {
                "get": {
                    "summary": "The runtime policy: effective values, overlay, config file values",
                    "security": _secured(SCOPE_POLICY),
                    "responses": policy_responses,
                },
                "put": {
                    "summary": "Change runtime policy keys (reaches every worker within 1 s; persisted)",
                    "security": _secured(SCOPE_POLICY),
                    "requestBody": {"required": True, "content": {"application/json": {"schema": _POLICY_CHANGE}}},
                    "responses": {
                        **policy_responses,
                        "413": _json(_ERROR, "body over 16 KiB"),
                        "422": _json(_ERROR, "invalid input (field named)"),
                        "503": _json(_ERROR, "not applied: tls.state_dir cannot save it (disk full, read-only)"),
                    },
                },
                "delete": {
                    "summary": "Back to the config file's values",
                    "security": _secured(SCOPE_POLICY),
                    "responses": {
                        **policy_responses,
                        "503": _json(_ERROR, "not applied: tls.state_dir cannot save it (disk full, read-only)"),
                    },
                },
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus exposition (no token)",
                    "security": [],
                    "responses": {
                        "200": {
                            "description": "Prometheus text",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                }
            },
            "/": {
                "get": {
                    "summary": "The dashboard (one self-contained page; asks for a token)",
                    "security": [],
                    "responses": {
                        "200": {"description": "HTML", "content": {"text/html": {"schema": {"type": "string"}}}}
                    },
                }
            },
            "/openapi.json": {
                "get": {
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": _json({"type": "object"}, "OpenAPI 3.0 document")},
                }
            },
        },
    }
