"""The dashboard in a real browser: Debian's headless Chromium driven by chromedriver (selenium), against a
running fleet that serves external traffic meanwhile."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pytest

from tests import mgmt_client as mc
from tests.netns import external_host  # noqa: F401 - fixture
from tests.peers import HTTPBackend, wait_until
from tests.pqclient import PQClient

SNI = "shop.apps.test"
SHOT_ENV = "SENTIN8_DASHBOARD_SHOT"  # also write the screenshot here (docs/dashboard.png is made this way)


@pytest.fixture
def browser():
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver:
        pytest.skip("needs Debian's chromium and chromium-driver (./dev test installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1440,900", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    b = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    yield b
    b.quit()


def test_dashboard_shows_a_service_request_count_rising(external_host, fleet_factory, browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By

    web = HTTPBackend("web")
    try:
        fleet = fleet_factory(f"""
[[instances]]
service = "web"
id = "web-1"
host = "127.0.0.1"
port = {web.port}
[[instances]]
service = "web"
id = "web-2"
host = "127.0.0.1"
port = 9
state = "Draining"
[[instances]]
service = "billing"
id = "billing-1"
host = "127.0.0.1"
port = {web.port}
tls = true
[[domains]]
hostname = "{SNI}"
service = "web"
""", extra="[policy]\nwaf = true\n", host="0.0.0.0", mgmt=True)
        wait_until(lambda: mc.call(fleet.mgmt_url, "GET", "/health")[0] == 200, 10, what="mgmt up")
        stop = threading.Event()

        errors: list[str] = []

        def traffic() -> None:
            # this test is about the page, not the data path: a failed connection is noted and replaced
            while not stop.is_set():
                client = None
                try:
                    client = PQClient(external_host.connect(fleet.port), SNI)
                    client.handshake()
                    n = 0
                    while not stop.is_set():
                        n += 1  # now and then an attack shape: the WAF (on in this config) answers 403
                        path = b"/x?q=%3Cscript%3Ealert(1)%3C/script%3E" if n % 20 == 0 else b"/x"
                        client.request(b"GET " + path + b" HTTP/1.1\r\nHost: shop.apps.test\r\n\r\n")
                        time.sleep(0.01 + 0.02 * (n // 200 % 2))  # a changing rate, for the sparklines
                except Exception as exc:
                    errors.append(repr(exc))
                    stop.wait(0.1)
                finally:
                    if client is not None:
                        client.close()

        browser.get(fleet.mgmt_url + "/")
        wait_until(lambda: browser.find_element(By.ID, "login").is_displayed(), 10, what="token form")
        browser.find_element(By.ID, "tok").send_keys(
            mc.token(fleet.secret, scope="proxy:stats:read proxy:backends:read", exp=int(time.time()) + 3600))
        browser.find_element(By.ID, "go").click()
        t = threading.Thread(target=traffic, daemon=True)
        t.start()

        def requests_shown() -> int:
            # read in the page: the table is re-rendered every 2 s, so a held element reference goes stale
            text = browser.execute_script(
                "const c = document.querySelector('#services tbody td.requests'); return c ? c.textContent : '';")
            return int(text) if text.isdigit() else -1

        first = wait_until(lambda: (v := requests_shown()) > 0 and v, 15, 0.2, what="a request count")
        second = wait_until(lambda: (v := requests_shown()) > first and v, 10, 0.2, what="the count rising")
        wait_until(lambda: browser.execute_script("return document.getElementById('t-rps').textContent")
                   not in ("", "\u2013", "0"), 10, 0.2, what="a request rate")
        third = wait_until(lambda: (v := requests_shown()) > second and v, 10, 0.2, what="still rising")
        assert first < second < third
        assert browser.execute_script("return document.getElementById('status').textContent") == "ok"
        assert "WAF on" in browser.execute_script("return document.getElementById('t-poln').textContent")
        backends = browser.execute_script("return document.getElementById('backends').textContent")
        assert "web-1" in backends and "web-2" in backends and "billing-1" in backends
        # one more refresh for the screenshot; for docs/dashboard.png, a minute of history for the sparklines
        time.sleep(60 if os.environ.get(SHOT_ENV) else 2.5)
        stop.set()
        t.join(10)
        print(f"traffic errors (not under test here): {errors[:3]}")
        shot = tmp_path / "dashboard.png"
        assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000
        if os.environ.get(SHOT_ENV):
            shutil.copy(shot, os.environ[SHOT_ENV])
        # a refused token sends the operator back to the form, not to a broken page
        browser.execute_script("sessionStorage.setItem('sentin8.mgmt.token', 'bad'); location.reload();")
        wait_until(lambda: browser.find_element(By.ID, "login").is_displayed(), 10, 0.2, what="back to the form")
    finally:
        web.close()
