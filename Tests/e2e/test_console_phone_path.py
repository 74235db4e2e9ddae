"""The admin console from a phone, through the overlay itself (issue 26, item 3). A gateway hosts the console as the
service `ils-console`, which only admin identities may dial; the console still listens on 127.0.0.1 only. The phone
(an admin identity's tunnel, and Chromium at 390x844) signs in with a link minted by a desktop session, lists
identities and revokes one, and the desktop sees it. A device identity is refused by the controller before any byte
reaches the console, and a foreign Host is refused even through the overlay."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import Controller, ManagedProcess
from console_browser import Browser, Console, require_browser, sign_in_another
from test_services import ServiceTunnel, create, serve

pytestmark = pytest.mark.e2e


@dataclass
class PhonePath:
    controller: Controller
    console: Console
    admin_tunnel: ServiceTunnel
    device_tunnel: ServiceTunnel
    log_dir: Path


@pytest.fixture(scope="module")
def phone_path(controller: Controller) -> Iterator[PhonePath]:
    require_browser()
    log_dir = controller.log_dir
    started: list[ManagedProcess] = []
    try:
        create(controller, "gw-console", "gateway")
        create(controller, "phone-admin", "admin")
        create(controller, "phone-device", "device")
        r = controller.cli("admin", "service", "create", "ils-console", "--dial", "role:admin", "--bind", "@gw-console")
        assert r.returncode == 0, r.describe()
        console = Console(controller, "--allowed-host", "ils-console")
        console.start()
        started.append(console)
        started.append(serve(controller, "gw-console", "ils-console", console.base, log_dir))
        admin_tunnel = ServiceTunnel(controller, "phone-admin", "ils-console", log_dir)
        device_tunnel = ServiceTunnel(controller, "phone-device", "ils-console", log_dir)
        for tunnel in (admin_tunnel, device_tunnel):
            tunnel.start()
            started.append(tunnel)
        yield PhonePath(controller, console, admin_tunnel, device_tunnel, log_dir)
    finally:
        for process in reversed(started):
            process.stop()


def state(controller: Controller, name: str) -> str:
    r = controller.cli("admin", "identity", "show", name, "--json")
    assert r.returncode == 0, r.describe()
    return json.loads(r.stdout)["state"]


def test_phone_signs_in_through_the_overlay_and_revokes(phone_path: PhonePath) -> None:
    from selenium.webdriver.common.by import By

    controller, console = phone_path.controller, phone_path.console
    create(controller, "lost-laptop", "device")
    desktop, phone = Browser(), Browser(phone=True)
    try:
        desktop.driver.get(console.first_url)
        desktop.element("#identities")
        path = sign_in_another(desktop, console.base)
        assert path.startswith("/login?t=")

        overlay = phone_path.admin_tunnel.base_url
        phone.driver.get(overlay + path)
        phone.element("#identities")
        assert phone.driver.current_url == overlay + "/identities"
        assert "via overlay as phone-admin" in phone.element("header").text
        row = phone.element("tr[data-name='lost-laptop']")
        row.find_element(By.CSS_SELECTOR, "form[action='/identities/lost-laptop/revoke'] button").click()
        phone.wait(lambda d: d.switch_to.alert).accept()
        assert phone.element("#notice").text == "lost-laptop was revoked."
        phone.screenshot("phone-path-revoked")
        assert state(controller, "lost-laptop") == "revoked"

        # The desktop session, straight on 127.0.0.1, sees the change.
        desktop.driver.get(console.base + "/identities")
        cell = desktop.element("tr[data-name='lost-laptop'] td[data-label='State']")
        assert cell.text == "revoked"
        assert phone.errors() == [] and desktop.errors() == []
    finally:
        phone.quit()
        desktop.quit()


def test_a_device_identity_cannot_reach_the_console(phone_path: PhonePath) -> None:
    signed_in = phone_path.console.full_log().count("console signed in")
    with phone_path.device_tunnel.client(timeout=15) as client:
        r = client.get("/identities")
    assert r.status_code == 403 and r.json()["code"] == "dial_denied", r.text[:300]
    assert "<html" not in r.text
    # A login link through the refused tunnel opens nothing.
    assert phone_path.console.full_log().count("console signed in") == signed_in
    r = phone_path.controller.cli("admin", "audit", "--action", "dial.refused", "--json")
    assert r.returncode == 0, r.describe()
    assert any(e["target"] == "ils-console" and e["actor"] == "phone-device" for e in json.loads(r.stdout)), r.stdout


def test_the_host_check_holds_through_the_overlay(phone_path: PhonePath) -> None:
    with phone_path.admin_tunnel.client(timeout=15) as client:
        assert client.get("/signed-out", headers={"Host": "ils-console"}).status_code == 401
        assert client.get("/signed-out").status_code == 401  # 127.0.0.1:PORT, as a tunnel's browser sends it
    # A rebinding name: refused 421 by the tunnel itself now, before a circuit (and by the console behind it too;
    # ConsoleConfigurationTests and test_console_browser.py check that one directly). On a connection of its own: a
    # refused request on a connection that already carries a circuit resets that connection instead.
    with phone_path.admin_tunnel.client(timeout=15) as client:
        assert client.get("/signed-out", headers={"Host": "evil.example"}).status_code == 421
