"""The CRS on disk (``sentin8.crs``): which release a directory holds, the set-up written for it, the files and
plugins loaded in CRS's order, and the start-up, check-config and SIGHUP refusals of a directory that is not one
to load. Real CRS releases (``tests/crs_dirs.py``), real engine; CRS directories made in tmp dirs from them.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sentin8.config import Policy
from sentin8.crs import CrsError, CrsVersion, detect_version, init_defaults, layout, setup_directives
from sentin8.waf import WafEngine, WafExclusion, WafRequest, WafSettings, check_policy, rule_parts
from tests.crs_dirs import CRS_V3_RULES, CRS_V4_ROOT, CRS_V4_RULES, REPO, crs_copy, needs_v4
from tests.peers import free_port, one_web_service


def _get(target: bytes = b"/", headers: list[tuple[bytes, bytes]] | None = None) -> WafRequest:
    h = [(b"Host", b"shop.test"), (b"User-Agent", b"Mozilla/5.0"), (b"Accept", b"*/*"), *(headers or [])]
    return WafRequest(b"GET", target, "1.1", h, "shop.test", "198.51.100.7")


def _fake_release(dest: Path, version: str) -> Path:
    """A CRS 4.28 rules directory whose REQUEST-901 says it is ``version`` (a release this code does not know)."""
    rules = crs_copy(dest, CRS_V4_RULES, skip=("REQUEST-901-INITIALIZATION.conf",))
    text = (CRS_V4_RULES / "REQUEST-901-INITIALIZATION.conf").read_text()
    (rules / "REQUEST-901-INITIALIZATION.conf").write_text(text.replace("4.28.0", version))
    return rules


# ---- the release ------------------------------------------------------------------------------------------


def test_debian_crs_is_3_3_4_despite_its_backported_rule_tags():
    """Debian's 3.3.4-1+deb12u3 carries 3.3.0 and 3.3.7 ver: tags in a few rules; REQUEST-901 says 3.3.4."""
    assert detect_version(str(CRS_V3_RULES)) == CrsVersion(3, 3, 4)


@needs_v4
def test_crs_4_28_is_read_from_its_rules_and_loads():
    assert detect_version(str(CRS_V4_RULES)) == CrsVersion(4, 28, 0)
    engine = WafEngine(WafSettings(crs_dir=str(CRS_V4_RULES)))
    assert engine.crs_version == CrsVersion(4, 28, 0) and engine.rule_count > 500
    verdict = engine.inspect(_get(b"/api/v1/orders?id=42"))
    # 901001 refuses every request (status 500) when the set-up is missing: it did not fire
    assert not verdict.blocked and 901001 not in verdict.rule_ids


def test_the_setup_version_is_the_release_digits_run_together():
    assert CrsVersion(3, 3, 4).setup_version == 334
    assert CrsVersion(4, 28, 0).setup_version == 4280 and CrsVersion(4, 0, 0).setup_version == 400
    assert CrsVersion(3, 3, 7).known and CrsVersion(4, 99, 1).known
    assert not CrsVersion(3, 2, 0).known and not CrsVersion(5, 0, 0).known and not CrsVersion(2, 2, 9).known


@needs_v4
def test_the_release_is_read_from_tags_then_from_the_setup_example_beside_the_rules(tmp_path):
    rules = crs_copy(tmp_path / "tags", CRS_V4_RULES, skip=("REQUEST-901-INITIALIZATION.conf",))
    text = (CRS_V4_RULES / "REQUEST-901-INITIALIZATION.conf").read_text()
    unsigned = "\n".join(ln for ln in text.splitlines() if "SecComponentSignature" not in ln)
    (rules / "REQUEST-901-INITIALIZATION.conf").write_text(unsigned)
    assert detect_version(str(rules)) == CrsVersion(4, 28, 0)  # the ver: tags of REQUEST-901
    bare = crs_copy(tmp_path / "example", CRS_V4_RULES, skip=("REQUEST-901-INITIALIZATION.conf",))
    (bare / "REQUEST-901-INITIALIZATION.conf").write_text(unsigned.replace("ver:'OWASP_CRS/4.28.0'", ""))
    with pytest.raises(CrsError, match="cannot tell the CRS version"):
        detect_version(str(bare))
    os.symlink(CRS_V4_ROOT / "crs-setup.conf.example", tmp_path / "example" / "crs-setup.conf.example")
    assert detect_version(str(bare)) == CrsVersion(4, 28, 0)  # "# OWASP CRS ver.4.28.0" beside the rules


def test_a_directory_without_request_901_is_not_a_crs(tmp_path):
    rules = crs_copy(tmp_path / "crs", CRS_V3_RULES, skip=("REQUEST-901-INITIALIZATION.conf",))
    with pytest.raises(CrsError, match=r"no REQUEST-901-INITIALIZATION\.conf"):
        layout(str(rules))


@needs_v4
@pytest.mark.parametrize("version", ["5.0.0", "3.2.0", "2.2.9"])
def test_a_release_this_code_cannot_set_up_is_refused_with_the_key(tmp_path, version):
    rules = _fake_release(tmp_path / "crs", version)
    problem = check_policy(Policy(waf=True, waf_crs_dir=str(rules)))
    assert problem == f"policy.waf_crs_dir: {rules} holds CRS {version}; this release sets up CRS 3.3.x and 4.x"


@needs_v4
def test_a_directory_mixing_two_releases_is_refused(tmp_path):
    sqli = "REQUEST-942-APPLICATION-ATTACK-SQLI.conf"
    rules = crs_copy(tmp_path / "crs", CRS_V4_RULES, skip=(sqli,))
    os.symlink(CRS_V3_RULES / sqli, rules / sqli)  # 3.3.4's SQLi rules among 4.28's
    problem = check_policy(Policy(waf=True, waf_crs_dir=str(rules)))
    assert problem == (
        f"policy.waf_crs_dir: {sqli} is CRS 3.x but REQUEST-901-INITIALIZATION.conf is CRS 4.28.0: "
        "one release per directory"
    )


# ---- the set-up -------------------------------------------------------------------------------------------


def test_the_setup_uses_each_release_own_variable_names():
    v3 = setup_directives(CrsVersion(3, 3, 4), 2, 7)
    assert "setvar:tx.paranoia_level=2" in v3 and "tx.crs_setup_version=334" in v3
    assert "blocking_paranoia_level" not in v3 and "tx.inbound_anomaly_score_threshold=7" in v3
    v4 = setup_directives(CrsVersion(4, 28, 0), 2, 7)
    assert "setvar:tx.blocking_paranoia_level=2" in v4 and "setvar:tx.detection_paranoia_level=2" in v4
    assert "tx.crs_setup_version=4280" in v4 and "tx.paranoia_level" not in v4.replace("_paranoia_level", "")
    assert "tx.inbound_anomaly_score_threshold=7" in v4 and "tx.outbound_anomaly_score_threshold=4" in v4


# ---- REQUEST-901's defaults, given by the set-up -----------------------------------------------------------


def test_only_901s_plain_set_if_unset_rules_are_taken_as_defaults():
    text = b"""
# a comment: SecRule &TX:commented "@eq 0" "id:1,phase:1,pass,nolog,setvar:'tx.commented=1'"
SecRule &TX:plain "@eq 0" \\
    "id:901100,\\
    phase:1,\\
    pass,\\
    nolog,\\
    tag:'OWASP_CRS',\\
    ver:'OWASP_CRS/4.28.0',\\
    setvar:'tx.plain=GET HEAD, POST'"
SecRule &TX:refusing "@eq 0" "id:901001,phase:1,deny,status:500,log,msg:'no set-up'"
SecRule &TX:late "@eq 0" "id:901102,phase:2,pass,nolog,setvar:'tx.late=1'"
SecRule &TX:other "@eq 0" "id:901103,phase:1,pass,nolog,setvar:'tx.not_other=1'"
SecRule &TX:two "@eq 0" "id:901104,phase:1,pass,nolog,setvar:'tx.two=1',setvar:'tx.also=1'"
SecRule &TX:head "@eq 0" "id:901105,phase:1,pass,nolog,chain"
    SecRule &TX:chained "@eq 0" "setvar:'tx.chained=1'"
SecRule &TX:blocks "@eq 0" "id:901106,phase:1,pass,nolog,ctl:ruleEngine=Off,setvar:'tx.blocks=1'"
SecRule &TX:macro "@eq 0" "id:901107,phase:1,pass,nolog,setvar:'tx.macro=%{tx.plain}'"
"""
    assert init_defaults(text) == (
        ("plain", "setvar:'tx.plain=GET HEAD, POST'"),
        ("macro", "setvar:'tx.macro=%{tx.plain}'"),
    )


def test_the_setup_gives_a_default_only_for_an_unset_variable_and_known_references():
    init = (
        ("paranoia_level", "setvar:'tx.paranoia_level=1'"),  # the set-up's own: its value stays
        ("executing_paranoia_level", "setvar:'tx.executing_paranoia_level=%{TX.PARANOIA_LEVEL}'"),
        ("later", "setvar:'tx.later=%{tx.not_set_before}'"),  # 901 may set it by another rule first
        ("remote", "setvar:'tx.remote=%{REMOTE_ADDR}'"),
        ("allowed_methods", "setvar:'tx.allowed_methods=GET HEAD POST OPTIONS'"),
        ("copy", "setvar:'tx.copy=%{tx.allowed_methods}'"),
    )
    text = setup_directives(CrsVersion(3, 3, 4), 2, 7, init)
    given = text.splitlines()[-1]
    assert given.startswith('SecAction "id:900991,phase:1,pass,t:none,nolog,')
    assert "tx.paranoia_level=1" not in text and "setvar:tx.paranoia_level=2" in text
    assert "executing_paranoia_level" in given and "allowed_methods=GET" in given and "tx.copy=" in given
    assert "tx.later" not in given and "tx.remote" not in given
    assert "900991" not in setup_directives(CrsVersion(3, 3, 4), 2, 7, init[:1])


@pytest.mark.parametrize("source", [CRS_V3_RULES, pytest.param(CRS_V4_RULES, marks=needs_v4)], ids=["crs3", "crs4"])
def test_defaults_and_left_out_opt_ins_only_when_nothing_of_the_operators_runs_before_901(tmp_path, source):
    names = {name for name, _ in layout(str(source)).defaults}
    assert {"allowed_methods", "allowed_http_versions", "critical_anomaly_score"} <= names
    assert "crs_setup_version" not in names  # v4's is a refusal, v3's comes from the set-up
    rules = crs_copy(tmp_path / "crs", source)
    (rules / "REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf").write_text(
        'SecRule REQUEST_HEADERS:Host "@streq shop.test" "id:1000,phase:1,pass,nolog,setvar:tx.allowed_methods=GET"\n'
    )
    crs = layout(str(rules))
    assert crs.defaults == () and crs.rules[0].endswith("REQUEST-900-EXCLUSION-RULES-BEFORE-CRS.conf")
    if source == CRS_V3_RULES:  # the opt-in packages a REQUEST-900 file may switch on are loaded with it
        opt_in = {"REQUEST-912-DOS-PROTECTION.conf", "REQUEST-903.9002-WORDPRESS-EXCLUSION-RULES.conf"}
        assert opt_in <= {Path(p).name for p in crs.rules}
        assert not opt_in & {Path(p).name for p in layout(str(source)).rules}
    # the operator's own value holds: 901 gives the default only to a request it did not set it for
    engine = WafEngine(WafSettings(crs_dir=str(rules)))
    head = [(b"Host", b"shop.test"), (b"Content-Length", b"0")]
    post = WafRequest(b"POST", b"/", "1.1", head, "shop.test", "198.51.100.7")
    assert engine.inspect(post).blocked and not engine.inspect(_get()).blocked


@needs_v4
def test_a_plugin_before_901_keeps_the_defaults_with_901(tmp_path):
    rules = _with_probe_plugin(tmp_path / "crs", CRS_V4_RULES)
    assert layout(str(rules)).defaults == ()  # its before-file may test a variable 901 has not set yet


def test_a_901_rule_removed_by_the_operator_keeps_the_defaults_with_901(tmp_path):
    """Removing 901160 leaves tx.allowed_methods unset, as CRS would: a RESPONSE-999 file (SecRuleRemoveById
    reaches rules loaded before it) or a per-host exclusion naming a 901 rule."""
    rules = crs_copy(tmp_path / "crs", CRS_V3_RULES)
    (rules / "RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf").write_text("SecRuleRemoveById 901160\n")
    assert layout(str(rules)).defaults == ()
    given = [p.text for p in rule_parts(WafSettings(), layout(str(CRS_V3_RULES)), partial=False) if p.text]
    assert any("id:900991" in t for t in given)
    excluded = WafSettings(exclusions=(WafExclusion("legacy.test", (901160,)),))
    parts = rule_parts(excluded, layout(str(CRS_V3_RULES)), partial=False)
    assert not any("id:900991" in p.text for p in parts)


PROBE_CONFIG = 'SecAction "id:9500010,phase:1,pass,nolog,setvar:tx.probe_plugin_enabled=1"\n'
PROBE_BEFORE = (
    # runs after the plugin's config, before REQUEST-901 has initialised its defaults
    'SecRule TX:probe_plugin_enabled "@eq 1" "id:9500100,phase:1,pass,log,msg:\'config read\'"\n'
    'SecRule &TX:reporting_level "@eq 0" "id:9500101,phase:1,pass,log,msg:\'before 901\'"\n'
    # a detection of the plugin's own, scored like a CRS rule
    'SecRule REQUEST_HEADERS:X-Probe "@streq attack" '
    '"id:9500110,phase:2,block,log,setvar:tx.inbound_anomaly_score_pl1=+5"\n'
)
PROBE_AFTER = (
    'SecRule &TX:reporting_level "@eq 1" "id:9500200,phase:1,pass,log,msg:\'after 901\'"\n'
    'SecRule TX:blocking_paranoia_level "@eq 3" "id:9500201,phase:1,pass,log"\n'
    'SecRule TX:detection_paranoia_level "@eq 3" "id:9500202,phase:1,pass,log"\n'
    'SecRule TX:inbound_anomaly_score_threshold "@eq 7" "id:9500203,phase:1,pass,log"\n'
    'SecRule TX:crs_setup_version "@eq 4280" "id:9500204,phase:1,pass,log"\n'
)


def _with_probe_plugin(root: Path, source: Path) -> Path:
    rules = crs_copy(root, source)
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "probe-config.conf").write_text(PROBE_CONFIG)
    (plugins / "probe-before.conf").write_text(PROBE_BEFORE)
    (plugins / "probe-after.conf").write_text(PROBE_AFTER)
    (plugins / "probe-notes.conf.disabled").write_text("this is not loaded\n")
    return rules


@needs_v4
def test_crs4_plugins_load_in_the_documented_order_and_the_setup_reaches_the_rules(tmp_path):
    rules = _with_probe_plugin(tmp_path / "crs", CRS_V4_RULES)
    crs = layout(str(rules))
    assert [Path(p).name for p in crs.plugins_config + crs.plugins_before + crs.plugins_after] == [
        "probe-config.conf", "probe-before.conf", "probe-after.conf",
    ]  # fmt: skip
    engine = WafEngine(WafSettings(crs_dir=str(rules), paranoia=3, anomaly_threshold=7))
    ids = set(engine.inspect(_get()).rule_ids)
    assert {9500100, 9500101, 9500200} <= ids  # config -> before -> (REQUEST-901 ...) -> after
    assert {9500201, 9500202, 9500203, 9500204} <= ids  # the set-up's values, as the rules see them
    verdict = engine.inspect(_get(headers=[(b"X-Probe", b"attack")]))
    assert verdict.blocked is False  # 5 < 7: the plugin's score counts toward the CRS threshold...
    strict = WafEngine(WafSettings(crs_dir=str(rules)))
    verdict = strict.inspect(_get(headers=[(b"X-Probe", b"attack")]))
    assert verdict.blocked and {9500110, 949110} <= set(verdict.rule_ids)  # ...and blocks at 5
    assert verdict.families == ()  # plugin ids (9500000+) are no attack family of the CRS


@needs_v4
def test_a_plugin_that_does_not_load_names_the_key_and_the_file(tmp_path):
    rules = _with_probe_plugin(tmp_path / "crs", CRS_V4_RULES)
    (tmp_path / "crs" / "plugins" / "broken-before.conf").write_text('SecRule ARGS "@rx x" "id:9500900,nosuch"\n')
    problem = check_policy(Policy(waf=True, waf_crs_dir=str(rules)))
    assert problem is not None and problem.startswith("policy.waf_crs_dir: plugins/broken-before.conf:"), problem


def test_plugins_beside_crs_3_are_refused(tmp_path):
    rules = _with_probe_plugin(tmp_path / "crs", CRS_V3_RULES)
    problem = check_policy(Policy(waf=True, waf_crs_dir=str(rules)))
    assert problem is not None and "need CRS 4; these rules are CRS 3.3.4" in problem


def test_the_layout_leaves_out_ip_reputation_and_the_response_rules():
    v3 = [Path(p).name for p in layout(str(CRS_V3_RULES)).rules]
    assert "REQUEST-910-IP-REPUTATION.conf" not in v3 and "REQUEST-942-APPLICATION-ATTACK-SQLI.conf" in v3
    assert v3[0] == "REQUEST-901-INITIALIZATION.conf" and not any(n.startswith("RESPONSE-") for n in v3)


@needs_v4
def test_the_crs4_layout_has_every_request_file_and_no_response_rules():
    v4 = [Path(p).name for p in layout(str(CRS_V4_RULES)).rules]
    assert v4 == sorted(p.name for p in CRS_V4_RULES.glob("REQUEST-*.conf"))
    assert "REQUEST-934-APPLICATION-ATTACK-GENERIC.conf" in v4 and "REQUEST-999-COMMON-EXCEPTIONS-AFTER.conf" in v4


@pytest.mark.parametrize("source", [CRS_V3_RULES, pytest.param(CRS_V4_RULES, marks=needs_v4)], ids=["crs3", "crs4"])
def test_the_operators_response_999_exclusions_are_loaded_after_the_rules(tmp_path, source):
    """RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf (made from its .example): configure-time exclusions."""
    sqli = _get(b"/items?id=1%27%20OR%201=1--")
    assert WafEngine(WafSettings(crs_dir=str(source))).inspect(sqli).blocked
    rules = crs_copy(tmp_path / "crs", source)
    (rules / "RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf").write_text("SecRuleRemoveById 942100\n")
    assert not WafEngine(WafSettings(crs_dir=str(rules))).inspect(sqli).blocked


# ---- refusals at check-config, run and SIGHUP ------------------------------------------------------------


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@needs_v4
def test_an_unknown_release_exits_2_at_check_config_and_run_before_binding(tmp_path):
    rules = _fake_release(tmp_path / "crs", "5.0.0")
    port = free_port()
    path = tmp_path / "waf.toml"
    path.write_text(
        f'[listen]\nhttps = "127.0.0.1:{port}"\nhttp = ""\nmgmt = ""\n[tls]\nstate_dir = "{tmp_path}"\n'
        f'[policy]\nwaf = true\nwaf_crs_dir = "{rules}"\n'
    )
    for command in (["check-config", str(path)], ["run", "--config", str(path)]):
        out = _cli(*command)
        assert out.returncode == 2, out.stderr
        assert out.stderr.strip().splitlines() == [
            f"sentin8-proxy: config error: policy.waf_crs_dir: {rules} holds CRS 5.0.0; "
            "this release sets up CRS 3.3.x and 4.x"
        ]
    with socket.socket() as s:  # nothing bound the port
        s.bind(("127.0.0.1", port))


@needs_v4
def test_a_sighup_to_an_unknown_release_is_refused_and_crs4_keeps_serving(tmp_path, fleet_factory, web):
    waf = f'[policy]\nwaf = true\nwaf_crs_dir = "{CRS_V4_RULES}"\n'
    fleet = fleet_factory(one_web_service(web.port), workers=1, extra=waf)
    config = Path(fleet.config)
    good = config.read_text()
    config.write_text(good.replace(str(CRS_V4_RULES), str(_fake_release(tmp_path / "crs5", "5.0.0"))))
    refused = _cli("reload", "--config", fleet.config, "--wait")
    assert refused.returncode == 1 and "refused" in refused.stderr, refused.stderr
    reason = fleet.events("reload_refused")[-1]["reason"]
    assert reason.startswith("policy.waf_crs_dir: ") and "holds CRS 5.0.0" in reason
    config.write_text(good)
    assert _cli("reload", "--config", fleet.config, "--wait").returncode == 0  # CRS 4.28 still loads


@pytest.mark.parametrize("source", [CRS_V3_RULES, pytest.param(CRS_V4_RULES, marks=needs_v4)], ids=["crs3", "crs4"])
def test_a_phase_1_regex_that_hits_the_match_limit_refuses_the_request(tmp_path, source):
    """Rule 200005: padding a payload until a phase-1 rule's regex gives up is not a way through."""
    rules = crs_copy(tmp_path / "crs", source)
    (rules / "REQUEST-950-LIMIT-PROBE.conf").write_text(
        'SecRule ARGS "@rx ^(a+)+$" "id:1999,phase:1,pass,log,msg:\'catastrophic backtracking\'"\n'
    )
    engine = WafEngine(WafSettings(crs_dir=str(rules)))
    verdict = engine.inspect(_get(b"/?q=" + b"a" * 40 + b"b"))
    assert verdict.blocked and verdict.status == 403 and 200005 in verdict.rule_ids, verdict
    assert not engine.inspect(_get(b"/?q=ab")).blocked


@pytest.mark.parametrize("source", [CRS_V3_RULES, pytest.param(CRS_V4_RULES, marks=needs_v4)], ids=["crs3", "crs4"])
@pytest.mark.parametrize("where", ["query", "cookie", "form"])
def test_a_long_token_is_not_refused(source, where):
    """Eight 932 rules of CRS 4.28 (932150 of 3.3.4) hit the match limit on 1,000 alphanumerics, in phase 2:
    200005 must not see those, or every long session token, JWT or API key would be refused."""
    token = b"eyJ" + b"x7Kq9ZpR2m" * 400  # 4 KiB, no separators
    form = [
        (b"Host", b"shop.test"),
        (b"User-Agent", b"Mozilla/5.0"),
        (b"Content-Type", b"application/x-www-form-urlencoded"),
        (b"Content-Length", b"%d" % (len(token) + 6)),
    ]
    r = {
        "query": _get(b"/?token=" + token),
        "cookie": _get(headers=[(b"Cookie", b"session=" + token)]),
        "form": WafRequest(b"POST", b"/login", "1.1", form, "shop.test", "198.51.100.7", body=b"token=" + token),
    }[where]  # fmt: skip
    verdict = WafEngine(WafSettings(crs_dir=str(source))).inspect(r)
    assert not verdict.blocked, verdict


def test_the_engine_transaction_is_named_by_the_request_correlation_id(tmp_path):
    """``WafRequest.tx_id`` (the correlation id) is the engine's UNIQUE_ID; without one, a counter of the engine."""
    rules = crs_copy(tmp_path / "crs", CRS_V3_RULES)
    (rules / "RESPONSE-999-EXCLUSION-RULES-AFTER-CRS.conf").write_text(
        'SecRule UNIQUE_ID "@streq proxy-42" "id:1001,phase:1,pass,log"\n'
        'SecRule UNIQUE_ID "@rx ^[0-9a-f]+$" "id:1002,phase:1,pass,log"\n'
    )
    engine = WafEngine(WafSettings(crs_dir=str(rules)))
    named = dataclasses.replace(_get(), tx_id=b"proxy-42")
    assert {1001} <= set(engine.inspect(named).rule_ids) and 1002 not in engine.inspect(named).rule_ids
    ids = engine.inspect(_get()).rule_ids
    assert 1002 in ids and 1001 not in ids
