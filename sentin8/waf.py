"""The WAF: the ModSecurity v3 engine with the OWASP Core Rule Set, in anomaly-scoring mode. Sans-IO.

The engine is the C library shipped in the ``libmodsecurity`` wheel, driven through its C API with ``ctypes``
rather than through the wheel's Python binding, for one reason: a ``ctypes`` foreign call releases the GIL and
the binding's calls do not (measured: a 65 KB URL held every other thread of the process for its whole
inspection). So ``WafEngine.inspect`` can run on a worker thread while the event loop keeps serving the other
connections; and a small request can be inspected inline without a thread hop. Every call made for one
transaction happens inside ``inspect``: one transaction per call, owned by the calling thread, no shared
mutable state but the read-only rule set (the engine is built for concurrent transactions over one rule set).

The rule set is: the engine directives below (body access, the JSON/XML/multipart body processors of
ModSecurity's recommended configuration, PCRE match limits so that no input can make a regex run unbounded),
the CRS set-up (paranoia level, inbound anomaly threshold), the per-host exclusions, then Debian's
``modsecurity-crs`` REQUEST-* rules except REQUEST-910 (IP reputation needs GeoIP, which the engine lacks).
The CRS blocks in phase 2 (REQUEST-949), so the body phase runs for body-less requests too. Responses are not
inspected (the RESPONSE-* rules would need the response buffered).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .config import Policy

CRS_RULES_DIR = "/usr/share/modsecurity-crs/rules"
LEFT_OUT = ("REQUEST-910-IP-REPUTATION.conf",)  # needs GeoIP
# Per regex evaluation: bounds backtracking on any input. ModSecurity's recommended 1000; at 5000 a fuzzer found
# 4 KB inputs that cost 2.4 s of CPU, at 1000 the worst 64 KiB input it found costs ~0.3 s (linear in size).
PCRE_MATCH_LIMIT = 1000
RULE_IDS_MAX = 32  # matched rule ids reported per request (the rest are counted as truncated)

# CRS rule-id ranges -> attack family, for counters (one counter per family, not per rule).
FAMILIES: tuple[tuple[int, int, str], ...] = (
    (911000, 911999, "method"),
    (913000, 913999, "scanner"),
    (920000, 920999, "protocol"),
    (921000, 921999, "protocol_attack"),
    (922000, 922999, "multipart"),
    (930000, 930999, "lfi"),
    (931000, 931999, "rfi"),
    (932000, 932999, "rce"),
    (933000, 933999, "php"),
    (934000, 934999, "nodejs"),
    (941000, 941999, "xss"),
    (942000, 942999, "sqli"),
    (943000, 943999, "session_fixation"),
    (944000, 944999, "java"),
    (200000, 200999, "body_parse"),
)


def family(rule_id: int) -> str | None:
    """The attack family of a CRS rule id (``942100`` -> ``sqli``); None for bookkeeping rules (901, 949...)."""
    for low, high, name in FAMILIES:
        if low <= rule_id <= high:
            return name
    return None


class WafLoadError(Exception):
    """The rule set did not load; the message says why (the config layer prefixes ``policy.waf: ``)."""


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
    # through. Refuse instead (ModSecurity's recommended configuration does the same).
    lines.append('SecRule TX:/^MSC_/ "!@streq 0" "id:200005,phase:2,t:none,log,deny,status:403,msg:\'Engine limit\'"')
    return "\n".join(lines) + "\n"


def _crs_setup(s: WafSettings) -> str:
    return (
        'SecDefaultAction "phase:1,log,auditlog,pass"\n'
        'SecDefaultAction "phase:2,log,auditlog,pass"\n'
        f'SecAction "id:900000,phase:1,nolog,pass,t:none,setvar:tx.paranoia_level={s.paranoia}"\n'
        f'SecAction "id:900110,phase:1,nolog,pass,t:none,'
        f"setvar:tx.inbound_anomaly_score_threshold={s.anomaly_threshold},"
        f'setvar:tx.outbound_anomaly_score_threshold=4"\n'
        'SecAction "id:900990,phase:1,nolog,pass,t:none,setvar:tx.crs_setup_version=334"\n'
    )


_HOST = re.compile(r"(\*\.)?[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")


def _exclusion_rules(s: WafSettings) -> str:
    out = []
    for i, ex in enumerate(s.exclusions):
        host = ex.host.lower()
        if not _HOST.fullmatch(host) or not ex.rule_ids:
            raise WafLoadError(f"waf_exclusions[{i}]: needs a hostname (or *.domain) and at least one rule id")
        op = f"@endsWith {host[1:]}" if host.startswith("*.") else f"@streq {host}"
        removes = ",".join(f"ctl:ruleRemoveById={int(r)}" for r in ex.rule_ids)
        actions = f"id:{10000 + i},phase:1,t:none,t:lowercase,pass,nolog,{removes}"
        out.append(f'SecRule REQUEST_HEADERS:Host "{op}" "{actions}"')
    return "\n".join(out) + "\n"


def crs_files(crs_dir: str) -> list[str]:
    files = sorted(glob.glob(os.path.join(crs_dir, "REQUEST-*.conf")))
    return [f for f in files if os.path.basename(f) not in LEFT_OUT]


# ---- the C API -----------------------------------------------------------------------------------------


_LOG_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


@_LOG_CB
def _discard_log(_data: int | None, _message: int | None) -> None:
    """The engine's text log: unused (matched rule ids are read from the transaction, never payload text).
    Without a callback the engine prints every match, payload excerpts included, on stdout."""


class _Intervention(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int),
        ("pause", ctypes.c_int),
        ("url", ctypes.c_char_p),
        ("log", ctypes.c_char_p),
        ("disruptive", ctypes.c_int),
    ]


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
            "msc_new_transaction": ([vp, vp, vp], vp),
            "msc_process_connection": ([vp, cp, i, cp, i], i),
            "msc_process_uri": ([vp, cp, cp, cp], i),
            "msc_add_n_request_header": ([vp, cp, sz, cp, sz], i),
            "msc_process_request_headers": ([vp], i),
            "msc_append_request_body": ([vp, cp, sz], i),
            "msc_process_request_body": ([vp], i),
            "msc_intervention": ([vp, ctypes.POINTER(_Intervention)], i),
            "msc_intervention_cleanup": ([ctypes.POINTER(_Intervention)], None),
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

    def __init__(self, lib: ctypes.CDLL, settings: WafSettings, partial: bool) -> None:
        self.lib = lib
        self.ptr = lib.msc_create_rules_set()
        self.count = 0
        self._add(_engine_directives(settings, partial), "engine directives")
        self._add(_crs_setup(settings), "CRS set-up")
        if settings.exclusions:
            self._add(_exclusion_rules(settings), "policy.waf_exclusions")
        files = crs_files(settings.crs_dir)
        if not files:
            raise WafLoadError(f"no CRS rules in {settings.crs_dir} (install Debian's modsecurity-crs)")
        for path in files:
            err = ctypes.c_char_p()
            n = lib.msc_rules_add_file(self.ptr, path.encode(), ctypes.byref(err))
            if n < 0:
                raise WafLoadError(f"{os.path.basename(path)}: {self._error(err)}")
            self.count += n

    def _add(self, text: str, what: str) -> None:
        err = ctypes.c_char_p()
        n = self.lib.msc_rules_add(self.ptr, text.encode(), ctypes.byref(err))
        if n < 0:
            raise WafLoadError(f"{what}: {self._error(err)}")
        self.count += n

    @staticmethod
    def _error(err: ctypes.c_char_p) -> str:
        return (err.value or b"rule set error").decode("utf-8", "replace").strip().splitlines()[0]


class WafEngine:
    """The loaded engine and rule set(s). ``inspect`` is thread-safe and releases the GIL while the engine runs."""

    def __init__(self, settings: WafSettings) -> None:
        if not 1 <= settings.paranoia <= 4:
            raise WafLoadError(f"paranoia must be 1..4, got {settings.paranoia}")
        self.settings = settings
        lib = self._lib = _load_library()
        self._msc = lib.msc_init()
        lib.msc_set_connector_info(self._msc, b"sentin8-proxy")
        lib.msc_set_log_cb(self._msc, _discard_log)
        self._rules = _RuleSet(lib, settings, partial=False)
        # a body cut at body_max cannot parse as JSON/XML/multipart: its rule set does not deny on that
        self._partial_rules = _RuleSet(lib, settings, partial=True) if settings.partial_bodies else None
        self.rule_count = self._rules.count

    def inspect(self, req: WafRequest) -> WafVerdict:
        lib = self._lib
        rules = self._partial_rules if req.truncated and self._partial_rules is not None else self._rules
        tx = lib.msc_new_transaction(self._msc, rules.ptr, None)
        if not tx:
            raise MemoryError("msc_new_transaction")
        it = _Intervention()
        try:
            blocked = self._run(lib, tx, req, it)
            status = it.status if blocked else 0
            ids = (ctypes.c_int64 * RULE_IDS_MAX)()
            n = lib.msc_get_rules_messages_rule_ids(tx, ids, RULE_IDS_MAX)
            rule_ids = tuple(dict.fromkeys(int(ids[k]) for k in range(min(n, RULE_IDS_MAX))))
            lib.msc_process_logging(tx)
        finally:
            lib.msc_intervention_cleanup(ctypes.byref(it))
            lib.msc_transaction_cleanup(tx)
        fams = tuple(dict.fromkeys(f for f in map(family, rule_ids) if f is not None))
        return WafVerdict(blocked, rule_ids, status, fams)

    @staticmethod
    def _run(lib: ctypes.CDLL, tx: int, req: WafRequest, it: _Intervention) -> bool:
        """The phases in order; True as soon as one of them intervenes (the CRS blocks in phase 2)."""

        def stop() -> bool:
            return bool(lib.msc_intervention(tx, ctypes.byref(it))) and bool(it.disruptive)

        lib.msc_process_connection(tx, req.client_ip.encode(), req.client_port, b"0.0.0.0", req.server_port)
        if stop():
            return True
        # the engine takes a NUL-terminated target; llhttp never lets a NUL byte through
        lib.msc_process_uri(tx, req.target, req.method, req.version.encode())
        if stop():
            return True
        host = req.host.encode()
        seen_host = False
        add = lib.msc_add_n_request_header
        for name, value in req.headers:
            if len(name) == 4 and name.lower() == b"host":
                value, seen_host = host, True  # the resolved name: what exclusions and rules compare
            add(tx, name, len(name), value, len(value))
        if not seen_host:
            add(tx, b"Host", 4, host, len(host))
        lib.msc_process_request_headers(tx)
        if stop():
            return True
        if req.body:
            lib.msc_append_request_body(tx, req.body, len(req.body))
        lib.msc_process_request_body(tx)  # always: the CRS decides in phase 2
        return stop()


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
    """Load the rule set a config asks for, as a start-up check: None, or ``policy.waf: <why>``."""
    if not policy.waf:
        return None
    try:
        WafEngine(settings_from_policy(policy))
    except WafLoadError as exc:
        return f"policy.waf: {exc}"
    return None
