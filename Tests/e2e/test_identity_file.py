"""An identity file written by another conforming client is accepted by `status` and `tunnel`.

docs/identities.md defines the file's JSON keys. A client written from that text may order the keys differently,
add keys of its own, and write its PEM with CRLF line ends, without a final newline, indented, or wrapped at another
width. This module enrolls a device the usual way, rebuilds its file by hand from those fields in such a shape, and
uses the rebuilt file for `status` and for a `tunnel` request through the overlay.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from conftest import STARTUP_TIMEOUT_S, Backend, Controller, ManagedProcess, cli_env, free_port

pytestmark = pytest.mark.e2e

SERVICE = "claude-api"


def enroll(controller: Controller, name: str, role: str) -> None:
    r = controller.cli("admin", "identity", "create", name, "--role", role, "-o", f"{name}.jwt")
    assert r.returncode == 0, f"creating identity {name}\n{r.describe()}"
    r = controller.cli("enroll", f"{name}.jwt")
    assert r.returncode == 0, f"enrolling {name}\n{r.describe()}"


def foreign_pem(pem: str) -> str:
    """The same PEM as another client might write it: base64 wrapped at 76 columns, lines indented with a space,
    CRLF line ends, no final newline."""
    lines = pem.strip().splitlines()
    body = "".join(lines[1:-1])
    wrapped = textwrap.wrap(body, 76)
    return "\r\n".join([lines[0], *(" " + line for line in wrapped), lines[-1]])


def rebuild(original: dict) -> str:
    """The enrolled file's fields, in reverse key order, with unknown keys, foreign PEM, and tab-indented JSON."""
    identity = dict(reversed(list(original["identity"].items())))
    identity["deviceModel"] = "iPad14,1"  # a key this implementation does not know
    rebuilt = {
        "writtenBy": "another-client 0.1",
        "privateKey": foreign_pem(original["privateKey"]),
        "caCertificate": foreign_pem(original["caCertificate"]),
        "certificate": foreign_pem(original["certificate"]),
        "identity": identity,
        "controller": original["controller"],
        "version": original["version"],
    }
    return "\n" + json.dumps(rebuilt, indent="\t") + "\n\n"


@pytest.fixture(scope="module")
def foreign_identity(controller: Controller) -> Iterator[str]:
    log_dir = controller.log_dir
    backend = Backend(log_dir)
    backend.start()
    gateway = None
    try:
        enroll(controller, "gw-foreign", "gateway")
        enroll(controller, "tablet", "device")
        gateway = ManagedProcess(
            "gateway-foreign",
            [str(controller.binary), "serve", "--mode", "ziti", "--identity", "identities/gw-foreign.json",
             "--service", SERVICE, "--backend", backend.url, "--log-level", "info"],
            log_dir,
            cwd=controller.root,
            env=cli_env(),
        )
        gateway.start()
        gateway.wait_for_log("hosting service", timeout=STARTUP_TIMEOUT_S)
        original = json.loads((controller.root / "identities" / "tablet.json").read_text())
        path = controller.root / "identities" / "tablet-foreign.json"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", newline="") as f:
            f.write(rebuild(original))
        assert "\\r\\n" in path.read_text()  # CRLF inside the PEM values, escaped in JSON
        yield "identities/tablet-foreign.json"
    finally:
        for p in (gateway, backend):
            if p is not None:
                p.stop()


def test_status_accepts_a_file_written_by_another_client(controller: Controller, foreign_identity: str) -> None:
    r = controller.cli("status", "--identity", foreign_identity, "--json")
    assert r.returncode == 0, r.describe()
    report = json.loads(r.stdout)
    assert report["name"] == "tablet"
    assert report["accepted"] is True


def test_tunnel_serves_with_a_file_written_by_another_client(controller: Controller, foreign_identity: str) -> None:
    port = free_port()
    tunnel = ManagedProcess(
        "tunnel-foreign",
        [str(controller.binary), "tunnel", "--identity", foreign_identity, "--service", SERVICE,
         "--listen", f"127.0.0.1:{port}", "--log-level", "info"],
        controller.log_dir,
        cwd=controller.root,
        env=cli_env(),
    )
    tunnel.start()
    try:
        tunnel.wait_for_log("tunnel listening")
        tunnel.wait_for_port(port)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", trust_env=False, timeout=30.0) as client:
            r = client.get("/health")
        assert r.status_code == 200, f"{r.status_code} {r.text}\n{tunnel.full_log()}"
    finally:
        tunnel.stop()
