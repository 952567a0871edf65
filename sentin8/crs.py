"""The OWASP Core Rule Set on disk: which release a rules directory holds, the set-up that release needs, and
the files to load in the order its documentation gives. Sans-IO but for reading the files it is pointed at.

The proxy writes the CRS set-up itself, from the ``policy.waf_*`` keys, instead of loading a ``crs-setup.conf``:
one place for the paranoia level and the threshold, checked like every other key. The set-up's variable names
changed between the two releases in use, so the release is read from the rules first:

- **3.3.x** (Debian 12's ``modsecurity-crs``): ``tx.paranoia_level``; ``tx.crs_setup_version=334`` for 3.3.4.
  REQUEST-910 (IP reputation) is left out: it needs GeoIP and an RBL lookup, which the engine here lacks. So
  are the opt-in packages (903.9xxx application exclusions, 912 DoS protection) unless a REQUEST-900 file of
  the operator's may switch them on: off, they only matched their own skip rules, on every request.
- **4.x** (the current line, installed by the operator): ``tx.blocking_paranoia_level`` and
  ``tx.detection_paranoia_level``, ``tx.crs_setup_version=4280`` for 4.28.0 (CRS's own convention: the version's
  digits run together). REQUEST-901 of v4 refuses every request (901001, status 500) without a
  ``crs_setup_version`` and initialises every other variable it needs itself. v4 has no IP reputation (910 and
  912 moved out to plugins), no GeoIP and no RBL rules: every operator it uses is in the engine. Plugins live in
  ``plugins/`` beside ``rules/`` and load as CRS documents: ``*-config.conf``, ``*-before.conf``, the rules,
  ``*-after.conf``.

Both: when no rule file of the operator's is loaded, the set-up gives 901's defaults itself (``init_defaults``),
so that its set-if-unset rules do not match. A rule match is what costs in libmodsecurity 3;
the two economies cut a benign GET's inspection from 3.51M to 2.82M instructions (CRS 3.3.4, paranoia 1), and
the corpus test replays every case through both rule sets for the same verdicts.

The release is read from REQUEST-901's ``SecComponentSignature "OWASP_CRS/x.y.z"`` (what the rules the engine
loads say they are), else from the ``ver:'OWASP_CRS/x.y.z'`` tags of that file, else from the
``crs-setup.conf.example`` beside the directory (its ``OWASP CRS ver.x.y.z`` header or tags). A rule file that
carries another major release's tags is refused: a directory mixing two releases loads but scores nonsense.
"""

from __future__ import annotations

import collections
import fnmatch
import glob
import os
import re
from dataclasses import dataclass

INIT_FILE = "REQUEST-901-INITIALIZATION.conf"
SETUP_EXAMPLE = "crs-setup.conf.example"
LEFT_OUT_V3 = ("REQUEST-910-IP-REPUTATION.conf",)  # needs GeoIP and RBL lookups
# 3.3's opt-in packages: each skips itself unless a variable is set that the set-up never sets (the application
# exclusions' tx.crs_exclusions_<app>, the DoS protection's tx.dos_*). Only a REQUEST-900 file of the operator's
# could set one; without one they are left out, as they would do nothing but match their own skip rules.
OPT_IN_V3 = ("REQUEST-903.9*-EXCLUSION-RULES.conf", "REQUEST-912-DOS-PROTECTION.conf")
# The operator's own exclusions made from RESPONSE-999-...conf.example: configure-time directives
# (SecRuleRemoveById...) that CRS places after every rule file. The other RESPONSE-* files are not loaded:
# responses are not inspected.
AFTER_RULES = "RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf"
OUTBOUND_THRESHOLD = 4  # the CRS default; unused while responses are not inspected, but 901 expects it set

_SIGNATURE = re.compile(rb'^\s*SecComponentSignature\s+"OWASP_CRS/(\d+)\.(\d+)\.(\d+)"', re.M)
_TAG = re.compile(rb"ver:'OWASP_CRS/(\d+)\.(\d+)\.(\d+)'")
_HEADER = re.compile(rb"OWASP CRS ver\.(\d+)\.(\d+)\.(\d+)")


class CrsError(Exception):
    """The directory is not a CRS this code can set up; the message says why (``policy.waf_crs_dir`` is the key)."""


@dataclass(frozen=True, order=True)
class CrsVersion:
    major: int
    minor: int
    patch: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    @property
    def setup_version(self) -> int:
        """``tx.crs_setup_version`` as the release's own crs-setup.conf.example writes it: 3.3.4 -> 334."""
        return int(f"{self.major}{self.minor}{self.patch}")

    @property
    def known(self) -> bool:
        return (self.major, self.minor) == (3, 3) or self.major == 4


KNOWN = "3.3.x and 4.x"


@dataclass(frozen=True)
class CrsLayout:
    """What to load for one rules directory: the release, then the files in order around the set-up."""

    version: CrsVersion
    plugins_config: tuple[str, ...]  # before the rules: tx variables plugins read (after the set-up)
    plugins_before: tuple[str, ...]
    rules: tuple[str, ...]  # REQUEST-*.conf, then the operator's RESPONSE-999 exclusions when present
    plugins_after: tuple[str, ...]
    # REQUEST-901's defaults, for the set-up to give first (``init_defaults``); empty when the directory holds a
    # rule file of the operator's (a plugin, REQUEST-900, RESPONSE-999)
    defaults: tuple[tuple[str, str], ...] = ()


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return None


def _version_in(text: bytes, first: re.Pattern[bytes] | None = None) -> CrsVersion | None:
    """The version ``first`` names, else the one most of the text's ``ver:`` tags carry."""
    found = first.search(text) if first is not None else None
    if found is not None:
        return CrsVersion(*map(int, found.groups()))
    tags = collections.Counter(_TAG.findall(text))
    if not tags:
        return None
    return CrsVersion(*map(int, tags.most_common(1)[0][0]))


def detect_version(rules_dir: str) -> CrsVersion:
    """The CRS release in ``rules_dir`` (see the module docstring for where it is read); CrsError if none."""
    init = _read(os.path.join(rules_dir, INIT_FILE))
    if init is None:
        raise CrsError(f"{rules_dir} has no {INIT_FILE}: not an OWASP CRS rules directory")
    version = _version_in(init, _SIGNATURE)
    if version is None:
        example = _read(os.path.join(os.path.dirname(os.path.normpath(rules_dir)), SETUP_EXAMPLE))
        version = _version_in(example, _HEADER) if example is not None else None
    if version is None:
        raise CrsError(f"cannot tell the CRS version of {rules_dir} (no OWASP_CRS signature or ver: tag)")
    return version


def _major_mismatch(path: str, major: int) -> int | None:
    text = _read(path) or b""
    majors = {int(m) for m, _minor, _patch in _TAG.findall(text)}
    return next((m for m in sorted(majors) if m != major), None)


def plugins_dir(rules_dir: str) -> str:
    """Where CRS v4 plugins live: ``plugins/`` beside ``rules/``."""
    return os.path.join(os.path.dirname(os.path.normpath(rules_dir)), "plugins")


def layout(rules_dir: str) -> CrsLayout:
    """The release and the files to load; CrsError for no rules, an unknown release or a mixed directory."""
    rules = sorted(glob.glob(os.path.join(glob.escape(rules_dir), "REQUEST-*.conf")))
    if not rules:
        raise CrsError(f"no CRS rules (REQUEST-*.conf) in {rules_dir}")
    version = detect_version(rules_dir)
    if not version.known:
        raise CrsError(f"{rules_dir} holds CRS {version}; this release sets up CRS {KNOWN}")
    operator_first = any(os.path.basename(f) < INIT_FILE for f in rules)  # REQUEST-900: may set any variable
    if version.major == 3:
        rules = [f for f in rules if os.path.basename(f) not in LEFT_OUT_V3]
        if not operator_first:
            rules = [f for f in rules if not any(fnmatch.fnmatch(os.path.basename(f), p) for p in OPT_IN_V3)]
    after = os.path.join(rules_dir, AFTER_RULES)
    if os.path.isfile(after):
        rules.append(after)
    for path in rules:
        other = _major_mismatch(path, version.major)
        if other is not None:
            raise CrsError(
                f"{os.path.basename(path)} is CRS {other}.x but {INIT_FILE} is CRS {version}: one release per directory"
            )
    pdir = glob.escape(plugins_dir(rules_dir))
    kinds = ("config", "before", "after")
    plugins = {kind: tuple(sorted(glob.glob(os.path.join(pdir, f"*-{kind}.conf")))) for kind in kinds}
    if version.major == 3 and any(plugins.values()):
        raise CrsError(f"{plugins_dir(rules_dir)} holds CRS plugins, which need CRS 4; these rules are CRS {version}")
    # a file of the operator's may test or set 901's variables before it, or remove one of its rules (a
    # configure-time SecRuleRemoveById reaches rules loaded before it): then 901 gives its defaults itself
    operators = operator_first or any(plugins.values()) or os.path.isfile(after)
    defaults = () if operators else init_defaults(_read(os.path.join(rules_dir, INIT_FILE)) or b"")
    return CrsLayout(version, plugins["config"], plugins["before"], tuple(rules), plugins["after"], defaults)


_SET_IF_UNSET = re.compile(r'SecRule\s+&TX:(\w+)\s+"@eq 0"\s+"([^"]*)"', re.I)
_CHAIN = re.compile(r'[",]\s*chain\s*[,"]')
_DEFAULT_ACTIONS = frozenset({"id", "phase", "pass", "nolog", "tag", "ver", "t", "setvar"})


def _directives(text: bytes) -> list[str]:
    """The config's directives, continuation lines joined, comments and blank lines left out."""
    joined = re.sub(rb"\\\r?\n", b" ", text).decode("utf-8", "replace")
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def _actions(text: str) -> list[tuple[str, str]] | None:
    """A rule's action list as (name, argument) pairs, an argument's single quotes removed; None when the text
    is not a plain comma-separated list (an unbalanced quote)."""
    out: list[tuple[str, str]] = []
    for part in re.findall(r"(?:[^,']|'[^']*')+", text):
        name, _, arg = part.strip().partition(":")
        if "'" in name or arg.count("'") % 2:
            return None
        out.append((name.lower(), arg.strip().strip("'")))
    return out


def init_defaults(init_text: bytes) -> tuple[tuple[str, str], ...]:
    """(variable, ``setvar`` action) of each REQUEST-901 rule that gives one TX variable its default when nothing
    set it before, in file order: ``SecRule &TX:x "@eq 0" "id:..,phase:1,pass,nolog,setvar:'tx.x=..'"``.

    Why: such a rule *matches* on every request for which nothing set the variable, and a match is the costly
    part of a rule in libmodsecurity 3 (its message built through a ``std::stringstream``, the matched variables
    updated): ~15k instructions each, 16 of them per request with CRS 3.3.4. Given first by one ``SecAction`` of
    the set-up, the same values make each of those rules a non-match. Only rules of exactly that shape are
    taken (no other action, not chained); the set-up decides which of them it gives (``setup_directives``)."""
    out: list[tuple[str, str]] = []
    chain_next = False
    for directive in _directives(init_text):
        in_chain, chain_next = chain_next, _CHAIN.search(directive) is not None
        found = _SET_IF_UNSET.fullmatch(directive)
        actions = _actions(found.group(2)) if found is not None and not (in_chain or chain_next) else None
        if found is None or actions is None:
            continue
        name = found.group(1).lower()
        kinds = {kind for kind, _ in actions}
        setvars = [arg for kind, arg in actions if kind == "setvar"]
        if kinds - _DEFAULT_ACTIONS or "pass" not in kinds or ("phase", "1") not in actions or len(setvars) != 1:
            continue
        var, eq, _value = setvars[0].partition("=")
        if eq and var.lower() == f"tx.{name}":
            out.append((name, f"setvar:'{setvars[0]}'"))
    return tuple(out)


# CRS rule-id ranges -> attack family, for counters (one counter per family, not per rule). The ranges are the
# rule files' numbers, the same in 3.3 and 4.x; 934 is "NODEJS" in 3.3 and "GENERIC" in 4.x (Node.js, SSRF,
# prototype pollution, template injection...), so it is counted under the name of the file it comes from.
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
    (200006, 200008, "oversize"),  # the engine directives' own rules (sentin8.waf): a value too long to inspect
    (200000, 200999, "body_parse"),  # the others: a body that does not parse, the PCRE match limit
)
FAMILIES_V4 = tuple((lo, hi, "generic" if lo == 934000 else name) for lo, hi, name in FAMILIES)


def families_of(version: CrsVersion) -> tuple[tuple[int, int, str], ...]:
    return FAMILIES_V4 if version.major >= 4 else FAMILIES


def family(rule_id: int, families: tuple[tuple[int, int, str], ...] = FAMILIES) -> str | None:
    """The attack family of a CRS rule id (``942100`` -> ``sqli``); None for bookkeeping rules (901, 949...),
    plugins (9500000+) and the per-host exclusions."""
    for low, high, name in families:
        if low <= rule_id <= high:
            return name
    return None


def setup_directives(version: CrsVersion, paranoia: int, threshold: int, init: tuple[tuple[str, str], ...] = ()) -> str:
    """The crs-setup.conf equivalent for ``version``: default actions, paranoia, anomaly thresholds, setup version;
    then, in one ``SecAction``, the defaults REQUEST-901 would give (``init``, ``CrsLayout.defaults``): each one
    for a variable not set above, whose value names (``%{tx.x}``) only variables set before it.

    Ids 900000-900990 are the ones CRS's own crs-setup.conf.example uses for the same settings; 900991 is ours."""
    defaults = 'SecDefaultAction "phase:1,log,auditlog,pass"\nSecDefaultAction "phase:2,log,auditlog,pass"\n'
    head = "phase:1,pass,t:none,nolog"
    tag = f"tag:'OWASP_CRS',ver:'OWASP_CRS/{version}'"
    if version.major == 3:
        paranoia_vars = f"setvar:tx.paranoia_level={paranoia}"
    else:
        # detection = blocking: every rule that runs may block (CRS's default; no log-only extra level)
        paranoia_vars = f"setvar:tx.blocking_paranoia_level={paranoia},setvar:tx.detection_paranoia_level={paranoia}"
    text = (
        defaults
        + f'SecAction "id:900000,{head},{tag},{paranoia_vars}"\n'
        + f'SecAction "id:900110,{head},{tag},setvar:tx.inbound_anomaly_score_threshold={threshold},'
        f'setvar:tx.outbound_anomaly_score_threshold={OUTBOUND_THRESHOLD}"\n'
        + f'SecAction "id:900990,{head},{tag},setvar:tx.crs_setup_version={version.setup_version}"\n'
    )
    known = {name.lower() for name in re.findall(r"setvar:tx\.(\w+)=", text)}
    given = []
    for name, action in init:
        refs = {ref.lower() for ref in re.findall(r"%\{(?:tx\.)?([^}]*)\}", action, re.I)}
        if name in known or not refs <= known or re.search(r"%\{(?!tx\.)", action, re.I):
            continue
        given.append(action)
        known.add(name)
    if given:
        text += f'SecAction "id:900991,{head},{tag},{",".join(given)}"\n'
    return text
