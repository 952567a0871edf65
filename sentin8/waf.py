"""The WAF: the ModSecurity v3 engine with the OWASP Core Rule Set, in anomaly-scoring mode. Sans-IO.

The engine is the C library shipped in the ``libmodsecurity`` wheel, driven through its C API with ``ctypes``
rather than through the wheel's Python binding, for one reason: a ``ctypes`` foreign call releases the GIL and
the binding's calls do not (measured: a 65 KB URL held every other thread of the process for its whole
inspection). So ``WafEngine.inspect`` can run on a worker thread while the event loop keeps serving the other
connections; and a small request can be inspected inline without a thread hop. Every call made for one
transaction happens inside ``inspect``: one transaction per call, owned by the calling thread, no shared
mutable state but the read-only rule set (the engine is built for concurrent transactions over one rule set).

The rule set (``rule_parts``) is: the engine directives below (body access, the JSON/XML/multipart body
processors of ModSecurity's recommended configuration, PCRE match limits so that no input can make a regex run
unbounded), the CRS set-up for the release found in ``crs_dir`` (``sentin8.crs``: 3.3.x or 4.x, paranoia level,
anomaly thresholds), the per-host exclusions, then the CRS REQUEST-* rules with v4's plugins around them.
The CRS blocks in phase 2 (REQUEST-949), so the body phase runs for body-less requests too. Responses are not
inspected (the RESPONSE-* rules would need the response buffered).
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import itertools
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import pcre
from .crs import CrsError, CrsLayout, families_of, family, layout, setup_directives
from .waf_calls import Intervention, Transactions

if TYPE_CHECKING:
    from .config import Policy

CRS_RULES_DIR = "/usr/share/modsecurity-crs/rules"  # Debian's modsecurity-crs (3.3.x); CRS 4: the operator's
# Per regex evaluation: bounds backtracking on any input. ModSecurity's recommended 1000; at 5000 a fuzzer found
# 4 KB inputs that cost 2.4 s of CPU, at 1000 the worst 64 KiB input it found costs ~0.3 s (linear in size).
PCRE_MATCH_LIMIT = 1000
# The longest request target, cookie (name or value), User-Agent, Referer or argument name inspected; longer is
# refused before the CRS runs (rules 200006/200007). PCRE's match limit bounds backtracking per start position,
# not the number of start positions: CRS 4's 941160 rescans to the next space or slash from every quote or
# tag opener, so a 63 KB cookie of quotes costs 2 s of CPU (CRS 3.3: 50 ms). 8 KiB is nginx's and Apache's
# own line limit (large_client_header_buffers, LimitRequestLine/FieldSize), and browsers send no longer.
VALUE_MAX = 8192
# Argument values (query, form, JSON, multipart, XML) have no such cap: a body value may be long. What makes one
# costly is a quote or tag opener followed by a long run without whitespace or slash (941160's rescans): a 128
# KiB value of quotes cost 10.6 s with CRS 4.28. With a value over LONG_VALUE in the request, one such run over
# RUN_MAX is refused (200008; found in linear time: (*SKIP) jumps over a run once scanned). What is left costs at
# most ~0.5 s per 128 KiB body with either release (many values just under LONG_VALUE, runs just under RUN_MAX).
LONG_VALUE = 4096
RUN_MAX = 1024


class WafLoadError(Exception):
    """The rule set did not load; the message says why and ``key`` which ``policy`` key is to blame
    (``check_policy`` prints ``policy.<key>: <message>``)."""

    def __init__(self, message: str, key: str = "waf") -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class WafExclusion:
    """Rules switched off for one host (``*.example.com`` covers its subdomains): the CRS false-positive tool."""

    host: str
    rule_ids: tuple[int, ...]


@dataclass(frozen=True)
class WafSettings:
    paranoia: int = 1
    anomaly_threshold: int = 5
    body_max: int = 128 * 1024
    exclusions: tuple[WafExclusion, ...] = ()
    partial_bodies: bool = False  # an over-size body is inspected by its first ``body_max`` bytes (else 413)
    crs_dir: str = CRS_RULES_DIR


@dataclass
class WafRequest:
    """What the engine sees of one request. ``host`` is the name the proxy resolved (it stands in for Host)."""

    method: bytes
    target: bytes
    version: str
    headers: list[tuple[bytes, bytes]]
    host: str
    client_ip: str
    client_port: int = 0
    server_port: int = 443
    body: bytes = b""
    truncated: bool = False  # ``body`` is the first part of a longer body
    tx_id: bytes = b""  # the engine's transaction id (UNIQUE_ID): the request's correlation id; else a counter


@dataclass
class WafVerdict:
    blocked: bool
    rule_ids: tuple[int, ...] = ()  # the rules that matched (detections and the blocking evaluation)
    status: int = 0  # the engine's status when blocked (403 from the CRS; 400 for an unparsable body)
    families: tuple[str, ...] = field(default=())


def _engine_directives(s: WafSettings, partial: bool) -> str:
    limit = s.body_max
    lines = [
        "SecRuleEngine On",
        "SecRequestBodyAccess On",
        "SecResponseBodyAccess Off",
        f"SecRequestBodyLimit {limit}",
        f"SecRequestBodyNoFilesLimit {limit}",
        "SecRequestBodyLimitAction ProcessPartial",
        f"SecPcreMatchLimit {PCRE_MATCH_LIMIT}",
        f"SecPcreMatchLimitRecursion {PCRE_MATCH_LIMIT}",
        "SecAuditEngine Off",
        "SecArgumentSeparator &",
        "SecCookieFormat 0",
        # ModSecurity's recommended body processors: without them JSON and XML bodies are not parsed into ARGS
        'SecRule REQUEST_HEADERS:Content-Type "@rx (?i)^(?:application(?:/soap\\+|/)|text/)xml" '
        '"id:200000,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=XML"',
        'SecRule REQUEST_HEADERS:Content-Type "@rx (?i)^application/(?:.+\\+)?json" '
        '"id:200001,phase:1,t:none,t:lowercase,pass,nolog,ctl:requestBodyProcessor=JSON"',
    ]
    if not partial:
        # A body that claims a format and does not parse would otherwise skip inspection (an evasion).
        # Not for a body cut at body_max: its end is missing by construction.
        lines += [
            'SecRule REQBODY_ERROR "!@eq 0" '
            "\"id:200002,phase:2,t:none,log,deny,status:400,msg:'Failed to parse request body.'\"",
            'SecRule MULTIPART_STRICT_ERROR "!@eq 0" '
            "\"id:200003,phase:2,t:none,log,deny,status:400,msg:'Multipart request body failed strict validation'\"",
        ]
    # A regex that hit the match limit did not match: an attacker could pad a payload to exhaust it and walk
    # through. Refuse instead, where ModSecurity's recommended configuration does: before the CRS, so it sees the
    # phase-1 rules only. Checked after every rule it would also refuse every 1 KiB token (eight 932 rules of CRS
    # 4.28, 932150 of 3.3.4, give up on 1,000 alphanumerics): test_a_long_token_is_not_refused.
    lines.append('SecRule TX:/^MSC_/ "!@streq 0" "id:200005,phase:2,t:none,log,deny,status:403,msg:\'Engine limit\'"')
    lines += [
        "SecRule REQUEST_URI_RAW|REQUEST_COOKIES|REQUEST_COOKIES_NAMES|REQUEST_HEADERS:User-Agent|"
        f'REQUEST_HEADERS:Referer "@gt {VALUE_MAX}" '
        "\"id:200006,phase:1,t:none,t:length,log,deny,status:403,msg:'Value too long to inspect'\"",
        f'SecRule ARGS_NAMES "@gt {VALUE_MAX}" '
        "\"id:200007,phase:2,t:none,t:length,log,deny,status:403,msg:'Argument name too long to inspect'\"",
        # the decoding 941160 applies, so an encoded quote (&#39;, \\x27, %2527) counts as one
        f'SecRule ARGS|ARGS_NAMES|XML:/* "@gt {LONG_VALUE}" "id:200008,phase:2,t:none,t:length,log,deny,status:403,'
        "msg:'Value too costly to inspect',chain\"",
        'SecRule ARGS|ARGS_NAMES|XML:/* "@rx (?:[\\"\']|<[0-9A-Z_a-z])'
        f'(?:[^\\s\\x0b/]{{{RUN_MAX}}}|[^\\s\\x0b/]*+(*SKIP)(*F))" '
        '"t:none,t:utf8toUnicode,t:urlDecodeUni,t:htmlEntityDecode,t:jsDecode,t:cssDecode,t:removeNulls"',
    ]
    return "\n".join(lines) + "\n"


_HOST = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def _exclusion_rules(s: WafSettings) -> str:
    out = []
    for i, ex in enumerate(s.exclusions):
        host = ex.host.lower()
        if not _HOST.fullmatch(host) or not ex.rule_ids:
            raise WafLoadError("needs a hostname (or *.domain) and at least one rule id", f"waf_exclusions[{i}]")
        op = f"@endsWith {host[1:]}" if host.startswith("*.") else f"@streq {host}"
        removes = ",".join(f"ctl:ruleRemoveById={int(r)}" for r in ex.rule_ids)
        actions = f"id:{10000 + i},phase:1,t:none,t:lowercase,pass,nolog,{removes}"
        out.append(f'SecRule REQUEST_HEADERS:Host "{op}" "{actions}"')
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class RulePart:
    """One piece of the rule set, in load order: inline directives (``text``) or a rule file (``path``).
    ``what`` names it in an error, ``key`` is the config key to blame."""

    what: str
    key: str
    text: str = ""
    path: str = ""


def crs_layout(crs_dir: str) -> CrsLayout:
    """The CRS release and files in ``crs_dir``; WafLoadError (``waf_crs_dir``) when it is not one to load."""
    try:
        return layout(crs_dir)
    except CrsError as exc:
        raise WafLoadError(str(exc), "waf_crs_dir") from None


def rule_parts(s: WafSettings, crs: CrsLayout, partial: bool) -> list[RulePart]:
    """The whole rule set in order: engine directives, the CRS set-up for its release, the per-host exclusions,
    then plugin config, plugins before, the CRS rules, plugins after (CRS v4's documented order)."""
    key = "waf_crs_dir"
    if any(901000 <= r <= 901999 for ex in s.exclusions for r in ex.rule_ids):
        crs = dataclasses.replace(crs, defaults=())  # an exclusion of a 901 rule: 901 gives its defaults itself
    parts = [
        RulePart("engine directives", "waf", text=_engine_directives(s, partial)),
        RulePart(
            f"CRS {crs.version} set-up",
            key,
            text=setup_directives(crs.version, s.paranoia, s.anomaly_threshold, crs.defaults),
        ),
    ]
    if s.exclusions:
        parts.append(RulePart("waf_exclusions", "waf_exclusions", text=_exclusion_rules(s)))
    for path in crs.plugins_config + crs.plugins_before:
        parts.append(RulePart(f"plugins/{os.path.basename(path)}", key, path=path))
    for path in crs.rules:
        parts.append(RulePart(os.path.basename(path), key, path=path))
    for path in crs.plugins_after:
        parts.append(RulePart(f"plugins/{os.path.basename(path)}", key, path=path))
    return parts


# ---- the C API -----------------------------------------------------------------------------------------


_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


@_LOG_CB
def _discard_log(_data: int | None, _message: int | None) -> None:
    """The engine's text log: unused (matched rule ids are read from the transaction, never payload text).
    Without a callback the engine prints every match, payload excerpts included, on stdout."""


def _library_path() -> str:
    import libmodsecurity  # the wheel: only its shipped engine is used

    libs = os.path.join(os.path.dirname(os.path.dirname(libmodsecurity.__file__)), "libmodsecurity.libs")
    found = sorted(glob.glob(os.path.join(libs, "libmodsecurity-*.so*")))
    if not found:
        raise WafLoadError(f"the libmodsecurity wheel ships no engine library under {libs}")
    return found[0]


_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _load_library() -> ctypes.CDLL:
    global _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        pcre.preload()  # before the engine: its PCRE2 calls bind to a JIT-capable system copy when there is one
        try:
            lib = ctypes.CDLL(_library_path())  # CDLL: every call releases the GIL
        except (ImportError, OSError) as exc:
            raise WafLoadError(f"cannot load the ModSecurity engine ({exc})") from None
        vp, cp, i, sz = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_size_t
        sigs = {
            "msc_init": ([], vp),
            "msc_set_connector_info": ([vp, cp], None),
            "msc_set_log_cb": ([vp, _LOG_CB], None),
            "msc_create_rules_set": ([], vp),
            "msc_rules_add": ([vp, cp, ctypes.POINTER(cp)], i),
            "msc_rules_add_file": ([vp, cp, ctypes.POINTER(cp)], i),
            "msc_rules_error_cleanup": ([cp], None),
            "msc_new_transaction_with_id": ([vp, vp, cp, vp], vp),
            "msc_process_connection": ([vp, cp, i, cp, i], i),
            "msc_process_uri": ([vp, cp, cp, cp], i),
            "msc_add_n_request_header": ([vp, cp, sz, cp, sz], i),
            "msc_process_request_headers": ([vp], i),
            "msc_append_request_body": ([vp, cp, sz], i),
            "msc_process_request_body": ([vp], i),
            "msc_intervention": ([vp, ctypes.POINTER(Intervention)], i),
            "msc_intervention_cleanup": ([ctypes.POINTER(Intervention)], None),
            "msc_get_rules_messages_size": ([vp], sz),
            "msc_get_rules_messages_rule_ids": ([vp, ctypes.POINTER(ctypes.c_int64), sz], sz),
            "msc_process_logging": ([vp], i),
            "msc_transaction_cleanup": ([vp], None),
        }
        for name, (args, res) in sigs.items():
            fn = getattr(lib, name)
            fn.argtypes = args
            fn.restype = res
        _lib = lib
        return lib


class _RuleSet:
    """One compiled rule set (the engine's ``RulesSet``), read-only once loaded."""

    def __init__(self, lib: ctypes.CDLL, parts: list[RulePart]) -> None:
        self.lib = lib
        self.ptr = lib.msc_create_rules_set()
        self.count = 0
        for part in parts:
            err = ctypes.c_char_p()
            if part.path:
                n = lib.msc_rules_add_file(self.ptr, part.path.encode(), ctypes.byref(err))
            else:
                n = lib.msc_rules_add(self.ptr, part.text.encode(), ctypes.byref(err))
            if n < 0:
                raise WafLoadError(f"{part.what}: {self._error(err)}", part.key)
            self.count += n

    @staticmethod
    def _error(err: ctypes.c_char_p) -> str:
        return (err.value or b"rule set error").decode("utf-8", "replace").strip().splitlines()[0]


class WafEngine:
    """The loaded engine and rule set(s). ``inspect`` is thread-safe and releases the GIL while the engine runs."""

    def __init__(self, settings: WafSettings) -> None:
        if not 1 <= settings.paranoia <= 4:
            raise WafLoadError(f"must be within 1..4, got {settings.paranoia}", "waf_paranoia")
        self.settings = settings
        crs = crs_layout(settings.crs_dir)
        self.crs_version = crs.version
        self._families = families_of(crs.version)
        lib = self._lib = _load_library()
        self._msc = lib.msc_init()
        lib.msc_set_connector_info(self._msc, b"sentin8-proxy")
        lib.msc_set_log_cb(self._msc, _discard_log)
        self._rules = _RuleSet(lib, rule_parts(settings, crs, partial=False))
        # a body cut at body_max cannot parse as JSON/XML/multipart: its rule set does not deny on that
        partial = _RuleSet(lib, rule_parts(settings, crs, partial=True)) if settings.partial_bodies else None
        self._partial_rules = partial
        self.rule_count = self._rules.count
        self._ids = itertools.count(1)
        self._transactions = Transactions(lib)  # the per-request calls (waf_calls.py: C calls when compiled)

    def inspect(self, req: WafRequest) -> WafVerdict:
        rules = self._partial_rules if req.truncated and self._partial_rules is not None else self._rules
        # an id of ours: without one the engine makes its own from a std::random_device opened per transaction
        # (~25 µs, a twentieth of a benign GET's inspection)
        tx_id = req.tx_id or b"%x" % next(self._ids)
        blocked, status, rule_ids = self._transactions.run(self._msc, rules.ptr, tx_id, req)
        table = self._families
        fams = tuple(dict.fromkeys(f for f in (family(r, table) for r in rule_ids) if f is not None))
        return WafVerdict(blocked, rule_ids, status, fams)


def settings_from_policy(policy: Policy) -> WafSettings:
    """The engine settings a ``[policy]`` section asks for (equal settings = the same engine)."""
    return WafSettings(
        paranoia=policy.waf_paranoia,
        anomaly_threshold=policy.waf_anomaly_threshold,
        body_max=policy.waf_body_max,
        exclusions=tuple(WafExclusion(e.host.lower(), tuple(e.rule_ids)) for e in policy.waf_exclusions),
        partial_bodies=policy.waf_oversize == "inspect_prefix",
        crs_dir=policy.waf_crs_dir,
    )


def check_policy(policy: Policy) -> str | None:
    """Load the rule set a config asks for, as a start-up (and reload) check: None, or ``policy.<key>: <why>``
    (``policy.waf_crs_dir: ...`` for rules that do not load or a CRS release this code cannot set up)."""
    if not policy.waf:
        return None
    try:
        WafEngine(settings_from_policy(policy))
    except WafLoadError as exc:
        return f"policy.{exc.key}: {exc}"
    return None
