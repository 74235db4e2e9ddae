"""Helpers for the console's browser tests: the `admin console` process, headless Chromium driven by selenium
(Debian's chromium and chromium-driver, never Selenium Manager, which would fetch from the internet), and the
screenshot directory."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from conftest import REPO_ROOT, Controller, ManagedProcess, cli_env, free_port

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DESKTOP = (1280, 800)
PHONE = (390, 844)
WAIT_S = 20.0


def artifacts() -> Path:
    """Where screenshots go: $ILS_E2E_ARTIFACTS/console, or .ils-artifacts/console in the repository."""
    base = Path(os.environ.get("ILS_E2E_ARTIFACTS", REPO_ROOT / ".ils-artifacts"))
    directory = base / "console"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def require_browser() -> None:
    """Skips without a browser, unless ILS_REQUIRE_BROWSER=1 (CI), where a missing browser fails the suite."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    try:
        import selenium  # noqa: F401
    except ImportError:
        missing.append("python selenium")
    if missing:
        message = f"no browser for the console tests ({', '.join(missing)}): run deploy/install-deps.sh"
        if os.environ.get("ILS_REQUIRE_BROWSER") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


class Browser:
    """One headless Chromium with a profile of its own (so its own cookies)."""

    def __init__(self, phone: bool = False, loopback_names: tuple[str, ...] = ()) -> None:
        """`loopback_names` resolve to 127.0.0.1 in this browser (a rebinding name, another site's name)."""
        require_browser()
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="ils-chromium-")
        options = Options()
        options.binary_location = CHROMIUM
        for argument in (
            "--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
            f"--user-data-dir={self.profile}",
            # Nothing may come from the internet: every name but the test's own fails to resolve.
            "--host-resolver-rules=" + "".join(f"MAP {name} 127.0.0.1 , " for name in loopback_names)
            + "MAP * ~NOTFOUND , EXCLUDE 127.0.0.1, EXCLUDE localhost",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
        ):
            options.add_argument(argument)
        if phone:
            options.add_experimental_option(
                "mobileEmulation", {"deviceMetrics": {"width": PHONE[0], "height": PHONE[1], "pixelRatio": 2}}
            )
        else:
            options.add_argument(f"--window-size={DESKTOP[0]},{DESKTOP[1]}")
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.phone = phone
        self.driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
        self.driver.set_page_load_timeout(WAIT_S)

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)

    def wait(self, condition, timeout: float = WAIT_S):
        from selenium.webdriver.support.ui import WebDriverWait

        return WebDriverWait(self.driver, timeout).until(condition)

    def element(self, css: str, timeout: float = WAIT_S):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support import expected_conditions as ec

        return self.wait(ec.presence_of_element_located((By.CSS_SELECTOR, css)), timeout)

    def elements(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def errors(self) -> list[str]:
        """Severe lines of the browser's console: a CSP violation or a failed fetch shows here."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    def screenshot(self, name: str) -> Path:
        """The whole page (not only the viewport) saved under artifacts()."""
        size = "phone" if self.phone else "desktop"
        path = artifacts() / f"{name}-{size}.png"
        width = self.driver.execute_script("return document.documentElement.scrollWidth")
        height = self.driver.execute_script("return document.documentElement.scrollHeight")
        if not self.phone:
            self.driver.set_window_size(DESKTOP[0], max(DESKTOP[1], min(height + 120, 4000)))
        self.driver.save_screenshot(str(path))
        if not self.phone:
            self.driver.set_window_size(*DESKTOP)
        assert width > 0
        return path


class Console(ManagedProcess):
    """`admin console` on 127.0.0.1 and a free port, run as the controller's admin identity."""

    URL = re.compile(r"open (https?://\S+/login\?t=[A-Za-z0-9_-]+) \(one use, 10 minutes\)")

    def __init__(self, controller: Controller, *extra: str, identity: str = "identities/admin.json") -> None:
        self.port = free_port()
        super().__init__(
            "console",
            [str(controller.binary), "admin", "--identity", identity, "console",
             "--listen", f"127.0.0.1:{self.port}", "--log-level", "info", *extra],
            controller.log_dir,
            cwd=controller.root,
            env=cli_env(),
        )
        self.first_url: Optional[str] = None

    def start(self) -> None:
        super().start()
        self.wait_for_log("(one use, 10 minutes)")
        match = self.URL.search(self.full_log())
        assert match, self.logs()
        self.first_url = match.group(1)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def sign_in_another(browser: Browser, base: str) -> str:
    """Mints a login link from a signed-in browser (Sign in another device) and returns its path."""
    from selenium.webdriver.common.by import By

    browser.driver.get(base + "/identities")
    browser.driver.find_element(By.CSS_SELECTOR, "form[action='/login-links'] button").click()
    return browser.element("#login-path").text
