"""The management CLI's pure parts: where it connects, how --set values are read."""

from __future__ import annotations

import argparse

from sentin8.config import Config, Listen
from supervisor import mgmt_cli


def test_base_url_order(monkeypatch):
    monkeypatch.delenv(mgmt_cli.URL_ENV, raising=False)
    args = argparse.Namespace(url=None)
    assert mgmt_cli._base_url(args, Config()) == "http://127.0.0.1:9180"
    assert mgmt_cli._base_url(args, Config(listen=Listen(mgmt="0.0.0.0:9999"))) == "http://127.0.0.1:9999"
    assert mgmt_cli._base_url(args, Config(listen=Listen(mgmt="10.1.2.3:9181"))) == "http://10.1.2.3:9181"
    monkeypatch.setenv(mgmt_cli.URL_ENV, "http://mgmt.example:1/")
    assert mgmt_cli._base_url(args, Config()) == "http://mgmt.example:1"
    assert mgmt_cli._base_url(argparse.Namespace(url="http://x:2/"), Config()) == "http://x:2"


def test_set_values():
    assert [mgmt_cli.parse_value(v) for v in ("true", "OFF", "default", "2.5", "ip+host")] == [
        True, False, None, 2.5, "ip+host"]
