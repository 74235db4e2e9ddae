"""QR enrollment end to end (issue 26, item 1), with the real binary and a real decoder: `admin identity create
--qr-png` and `--qr` make codes that `zbarimg` (Debian's zbar-tools) reads back as `ils-enroll://v1/<token>`, and that
URI enrolls. A refused QR write leaves nothing behind."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from conftest import Controller

pytestmark = pytest.mark.e2e


def zbarimg(image: Path) -> str:
    """The text of the one QR code in `image`, as zbarimg reads it."""
    tool = shutil.which("zbarimg")
    if tool is None:
        pytest.fail("zbarimg is not installed: run deploy/install-deps.sh (apt-get install zbar-tools)", pytrace=False)
    done = subprocess.run([tool, "--raw", "-q", str(image)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"zbarimg found no code in {image}: {done.stderr}"
    return done.stdout.strip()


def test_png_code_decodes_to_a_uri_that_enrolls(controller: Controller) -> None:
    r = controller.cli("admin", "identity", "create", "qr-ipad", "--role", "device", "--qr-png", "qr-ipad.png")
    assert r.returncode == 0, r.describe()
    image = controller.root / "qr-ipad.png"
    assert stat.S_IMODE(image.stat().st_mode) == 0o600, "the code is a bearer credential: mode 0600"
    uri = zbarimg(image)
    assert uri.startswith("ils-enroll://v1/"), uri
    # Without -o the token is printed too: the same one the code carries.
    assert uri.removeprefix("ils-enroll://v1/") in r.stdout
    r = controller.cli("enroll", uri)
    assert r.returncode == 0, r.describe()
    assert (controller.root / "identities" / "qr-ipad.json").is_file()
    # One-time: the same code a second time is refused as used.
    r = controller.cli("enroll", uri, "--out", "identities/qr-ipad-again.json")
    assert r.returncode == 84 and "already used" in r.stderr, r.describe()  # token_used
    assert not (controller.root / "identities" / "qr-ipad-again.json").exists()


def test_terminal_code_carries_the_same_uri_and_a_file_holding_the_uri_enrolls(controller: Controller) -> None:
    r = controller.cli("admin", "identity", "create", "qr-mac", "--role", "device", "--qr", "-o", "qr-mac.jwt")
    assert r.returncode == 0, r.describe()
    lines = r.stdout.splitlines()
    uri = lines[-1]
    token = (controller.root / "qr-mac.jwt").read_text().strip()
    assert uri == f"ils-enroll://v1/{token}"
    drawing = [line for line in lines[:-1] if line]
    assert drawing and all(set(line) <= set("█▀▄ ") for line in drawing), "the code is drawn with half blocks"
    (controller.root / "qr-mac.uri").write_text(uri + "\n")
    r = controller.cli("enroll", "qr-mac.uri")
    assert r.returncode == 0, r.describe()


def test_an_existing_image_file_is_refused_before_the_controller_is_asked(controller: Controller) -> None:
    existing = controller.root / "taken.png"
    existing.write_bytes(b"not mine")
    r = controller.cli("admin", "identity", "create", "qr-taken", "--role", "device", "--qr-png", "taken.png")
    assert r.returncode != 0 and "already exists" in r.stderr, r.describe()
    assert existing.read_bytes() == b"not mine"
    # Nothing was created on the controller either: no identity whose token nobody holds.
    listed = controller.cli("admin", "identity", "list", "--json")
    assert listed.returncode == 0, listed.describe()
    assert "qr-taken" not in listed.stdout


@pytest.mark.parametrize("flag", ["-o", "--qr-png"])
def test_a_dangling_symlink_is_refused_before_the_controller_is_asked(controller: Controller, flag: str) -> None:
    """Issue 37, item 6: a dangling symbolic link passed the old check (which followed it), the identity was
    created, and the write was then refused (exit 73), leaving a pending identity whose token nobody held. Now the
    link counts as taken and nothing is created; a retry with another file works (no 409)."""
    name = f"dangling{flag.strip('-').replace('-', '')}"
    link = controller.root / f"{name}.out"
    link.symlink_to(controller.root / "nowhere" / "target")
    before = sorted(p.name for p in controller.root.iterdir())
    r = controller.cli("admin", "identity", "create", name, "--role", "device", flag, link.name)
    print(r.stderr.strip())
    assert r.returncode == 64, r.describe()  # invalid_argument
    assert "already exists" in r.stderr and "symbolic link" in r.stderr and "Nothing was created" in r.stderr, r.stderr
    assert link.is_symlink() and not link.exists(), "the link was replaced or followed"
    assert sorted(p.name for p in controller.root.iterdir()) == before, "a file was left behind"
    listed = controller.cli("admin", "identity", "list", "--json")
    assert listed.returncode == 0, listed.describe()
    assert name not in listed.stdout, "the identity was created on the controller"
    r = controller.cli("admin", "identity", "create", name, "--role", "device", flag, f"{name}.other")
    assert r.returncode == 0, r.describe()


def test_a_malformed_uri_is_refused_before_the_network(controller: Controller) -> None:
    r = controller.cli("enroll", "ils-enroll://v2/a.b.c")
    assert r.returncode == 80 and "not a valid JWT" in r.stderr, r.describe()  # token_malformed
    assert not any((controller.root / "identities").glob("*.json.tmp*"))
