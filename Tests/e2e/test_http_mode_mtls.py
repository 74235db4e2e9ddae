"""HTTP mode with client certificates (#23 item 2): `serve --mode http --identity` admits only active device
identities of its controller, passes the verified identity to the backend, and cuts a device's live streams when
the controller pushes its revocation. The real binary (controller and gateway) in front of the sample FastAPI
backend; clients are httpx, Python's ssl and curl with the identities' PEM files.
"""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from conftest import Backend, Certs, Controller, ManagedProcess, _openssl, cli_env, free_port
from sse_helpers import assert_gateway_error, parse_sse, timed_lines

pytestmark = pytest.mark.e2e

SERVICE = "claude-api"
CUT_BOUND_S = 5.0  # revocation command returned -> the device's live stream ended
HSTS_MAX_AGE = "1d"


@dataclass
class MTLS:
    controller: Controller
    backend: Backend
    gateway: ManagedProcess
    port: int
    certs: Certs
    pems: dict[str, tuple[Path, Path]]
    ids: dict[str, str]

    @property
    def base_url(self) -> str:
        return f"https://localhost:{self.port}"

    def context(self, name: Optional[str]) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.certs.ca_cert))
        if name is not None:
            cert, key = self.pems[name]
            ctx.load_cert_chain(str(cert), str(key))
        return ctx

    def client(self, name: Optional[str], timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url, verify=self.context(name), trust_env=False,
            timeout=httpx.Timeout(timeout, connect=5.0),
        )


def enroll(controller: Controller, name: str, role: str) -> None:
    r = controller.cli("admin", "identity", "create", name, "--role", role, "-o", f"{name}.jwt")
    assert r.returncode == 0, r.describe()
    r = controller.cli("enroll", f"{name}.jwt")
    assert r.returncode == 0, r.describe()


def pem_files(controller: Controller, name: str) -> tuple[Path, Path]:
    """The identity's certificate and key as PEM files, as `enroll --pem` writes them for curl and other clients."""
    data = json.loads((controller.root / "identities" / f"{name}.json").read_text())
    d = controller.log_dir / f"pem-{name}-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    (d / "cert.pem").write_text(data["certificate"])
    (d / "key.pem").write_text(data["privateKey"])
    os.chmod(d / "key.pem", 0o600)
    return d / "cert.pem", d / "key.pem"


def foreign_client_cert(certs: Certs) -> tuple[Path, Path]:
    """A client certificate issued by another CA (the e2e server CA, which the controller never saw)."""
    d = certs.dir / f"foreign-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "key.pem", cwd=d)
    _openssl("req", "-new", "-key", "key.pem", "-subj", "/CN=laptop/OU=device", "-out", "c.csr", cwd=d)
    (d / "c.ext").write_text("basicConstraints=critical,CA:FALSE\nextendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", "c.csr", "-CA", str(certs.ca_cert), "-CAkey", str(certs.ca_key),
             "-CAcreateserial", "-days", "1", "-sha256", "-extfile", "c.ext", "-out", "cert.pem", cwd=d)
    return d / "cert.pem", d / "key.pem"


@pytest.fixture(scope="module")
def mtls(controller: Controller, certs: Certs) -> Iterator[MTLS]:
    backend = Backend(controller.log_dir)
    backend.start()
    gateway: Optional[ManagedProcess] = None
    try:
        for name, role in (("web", "gateway"), ("laptop", "device"), ("phone", "device"), ("tablet", "device"),
                           ("kiosk", "device"), ("ops", "admin")):
            enroll(controller, name, role)
        pems = {name: pem_files(controller, name) for name in ("laptop", "phone", "tablet", "kiosk", "ops")}
        ids = {
            name: json.loads((controller.root / "identities" / f"{name}.json").read_text())["identity"]["id"]
            for name in pems
        }
        port = free_port()
        gateway = ManagedProcess(
            "gateway-http-mtls",
            [str(controller.binary), "serve", "--mode", "http", "--identity", "identities/web.json",
             "--service", SERVICE, "--listen", f"127.0.0.1:{port}", "--backend", backend.url,
             "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
             "--hsts-max-age", HSTS_MAX_AGE, "--log-level", "info"],
            controller.log_dir,
            cwd=controller.root,
            env=cli_env(),
        )
        gateway.start()
        gateway.wait_for_log("policy link up")
        gateway.wait_for_port(port)
        yield MTLS(controller, backend, gateway, port, certs, pems, ids)
    finally:
        for p in (gateway, backend):
            if p is not None:
                p.stop()


def backend_never_saw(m: MTLS, marker: str) -> bool:
    """Whether `marker` is missing from the backend's access log once a later request of an active device through
    the same gateway has shown up there: that request, not a clock, bounds the wait for a late line."""
    fence = uuid.uuid4().hex
    with m.client("laptop") as c:
        assert c.get(f"/debug/headers?probe={fence}").status_code == 200
    deadline = time.monotonic() + 10
    while fence not in m.backend.full_log():
        assert time.monotonic() < deadline, "a served request did not show up in the backend's access log"
        time.sleep(0.05)
    return marker not in m.backend.full_log()


def refused_at_handshake(m: MTLS, ctx: ssl.SSLContext) -> str:
    """Connects and sends a request with `ctx`; returns how it failed. The request must get no HTTP answer."""
    marker = uuid.uuid4().hex
    raw = socket.create_connection(("127.0.0.1", m.port), timeout=5)
    try:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            # TLS 1.3: the server checks the client's certificate after the client has finished its handshake, so
            # the refusal (an alert) arrives on the first read.
            tls.sendall(f"GET /debug/headers?probe={marker} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
            data = tls.recv(4096)
            assert not data, f"the gateway answered a client it should have refused at the handshake: {data!r}"
            outcome = "closed"
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as e:
        outcome = f"{type(e).__name__}: {e}"
    assert backend_never_saw(m, marker), "a refused client's request reached the backend"
    return outcome


def test_no_client_certificate_is_refused(mtls: MTLS) -> None:
    outcome = refused_at_handshake(mtls, mtls.context(None))
    print(f"no certificate: {outcome}")
    assert "CERTIFICATE_REQUIRED" in outcome, outcome


def test_certificate_from_another_ca_is_refused(mtls: MTLS) -> None:
    cert, key = foreign_client_cert(mtls.certs)
    ctx = mtls.context(None)
    ctx.load_cert_chain(str(cert), str(key))
    outcome = refused_at_handshake(mtls, ctx)
    print(f"another CA: {outcome}")
    assert "UNKNOWN_CA" in outcome, outcome


def test_active_device_streams_and_backend_sees_its_identity(mtls: MTLS) -> None:
    with mtls.client("laptop") as c:
        r = c.get("/debug/headers", headers={"X-ILS-Identity": "mallory", "X-ILS-Identity-Id": "mallory-id"})
        assert r.status_code == 200, r.text
        h = r.json()["headers"]
        assert h.get("x-ils-identity") == ["laptop"], h
        assert h.get("x-ils-identity-id") == [mtls.ids["laptop"]], h
        assert "mallory" not in json.dumps(h), f"a client-supplied identity reached the backend: {h}"
        assert r.headers.get("strict-transport-security") == "max-age=86400", r.headers
        # Server-Sent Events, event by event: the first arrives before the backend has written the last.
        with c.stream("GET", "/claude/stream", params={"n": 5, "interval_ms": 300}) as s:
            assert s.status_code == 200
            events = parse_sse(timed_lines(s))
        messages = [e for e in events if e.event == "message"]
        assert len(messages) == 5, events
        assert messages[0].received_at < messages[-1].json["emitted_at"], "the stream was buffered"


def test_curl_with_pem_files(mtls: MTLS) -> None:
    cert, key = mtls.pems["phone"]
    r = subprocess.run(
        ["curl", "-sS", "--max-time", "10", "--cacert", str(mtls.certs.ca_cert), "--cert", str(cert),
         "--key", str(key), f"{mtls.base_url}/debug/headers"],
        capture_output=True, text=True, timeout=20,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["headers"].get("x-ils-identity") == ["phone"], r.stdout


def test_identity_that_is_not_a_device_is_refused_with_json(mtls: MTLS) -> None:
    marker = uuid.uuid4().hex
    with mtls.client("ops") as c:
        r = c.get(f"/debug/headers?probe={marker}")
    body = assert_gateway_error(r, 403)
    assert body["code"] == "dial_denied", body
    assert r.headers.get("strict-transport-security") == "max-age=86400", r.headers
    assert backend_never_saw(mtls, marker)


def test_revoked_device_is_cut_and_refused(mtls: MTLS) -> None:
    """The tablet holds a live SSE stream and an idle keep-alive connection; the phone holds a stream too. Revoking
    the tablet ends its stream and its keep-alive connection; its next request is refused with identity_blocked;
    the phone's stream carries on."""
    tablet = mtls.client("tablet")
    phone = mtls.client("phone")
    try:
        with tablet.stream("GET", "/claude/stream", params={"n": 100000, "interval_ms": 100}) as ts, \
                phone.stream("GET", "/claude/stream", params={"n": 100000, "interval_ms": 100}) as ps:
            assert ts.status_code == 200 and ps.status_code == 200
            tablet_lines = ts.iter_lines()
            phone_lines = ps.iter_lines()
            next(tablet_lines)
            next(phone_lines)
            ended = threading.Event()

            def drain() -> None:
                try:
                    for _ in tablet_lines:
                        pass
                except httpx.HTTPError:
                    pass
                ended.set()

            threading.Thread(target=drain, daemon=True).start()
            # A keep-alive connection from before the revocation: it must not carry another request.
            with mtls.client("tablet") as idle:
                assert idle.get("/health").status_code == 200
                r = mtls.controller.cli("admin", "identity", "revoke", "tablet")
                assert r.returncode == 0, r.describe()
                returned = time.monotonic()
                assert ended.wait(CUT_BOUND_S), f"the revoked tablet's stream was still open after {CUT_BOUND_S} s"
                print(f"revoked tablet's stream ended {time.monotonic() - returned:.3f} s after the command returned")
                marker = uuid.uuid4().hex
                try:
                    again = idle.get(f"/debug/headers?probe={marker}")
                    # httpx retries once on a fresh connection when the pooled one was closed: that one is refused.
                    assert_gateway_error(again, 403)
                    assert again.json()["code"] == "identity_blocked", again.text
                except httpx.HTTPError:
                    pass
                assert backend_never_saw(mtls, marker), "the revoked device's request reached the backend"
            # The phone's stream carries on.
            for _ in range(3):
                next(phone_lines)
    finally:
        tablet.close()
        phone.close()
    marker = uuid.uuid4().hex
    # The module's gateway logged "client refused" for an earlier test already: wait for this refusal's own line.
    mark = len(mtls.gateway.full_log())
    with mtls.client("tablet") as c:
        r = c.get(f"/debug/headers?probe={marker}")
    body = assert_gateway_error(r, 403)
    assert body["code"] == "identity_blocked", body
    assert backend_never_saw(mtls, marker)
    refused = mtls.gateway.wait_for_log_count("client refused", after=mark)
    assert "tablet" in refused and "identity_blocked" in refused, refused


def test_deleted_device_is_refused(mtls: MTLS) -> None:
    """A deleted identity is in no block list; the gateway asks the controller about each connection's certificate."""
    with mtls.client("kiosk") as c:
        assert c.get("/health").status_code == 200
    r = mtls.controller.cli("admin", "identity", "delete", "kiosk")
    assert r.returncode == 0, r.describe()
    marker = uuid.uuid4().hex
    with mtls.client("kiosk") as c:
        r = c.get(f"/debug/headers?probe={marker}")
    body = assert_gateway_error(r, 403)
    assert body["code"] == "identity_blocked", body
    assert backend_never_saw(mtls, marker)


def test_open_http_mode_warns_at_startup(controller: Controller, certs: Certs) -> None:
    port = free_port()
    g = ManagedProcess(
        "gateway-http-open",
        [str(controller.binary), "serve", "--mode", "http", "--plain-http", "--listen", f"127.0.0.1:{port}",
         "--backend", "http://127.0.0.1:9", "--log-level", "info"],
        controller.log_dir, cwd=controller.root, env=cli_env(),
    )
    g.start()
    try:
        g.wait_for_log("anyone who reaches the port uses the backend")
        assert "warning" in g.full_log().lower()
    finally:
        g.stop()


def test_client_auth_none_is_explicit_and_warned(mtls: MTLS, controller: Controller, certs: Certs) -> None:
    port = free_port()
    g = ManagedProcess(
        "gateway-http-none",
        [str(controller.binary), "serve", "--mode", "http", "--identity", "identities/web.json",
         "--client-auth", "none", "--listen", f"127.0.0.1:{port}", "--tls-cert", str(certs.server_cert),
         "--tls-key", str(certs.server_key), "--backend", "http://127.0.0.1:9", "--log-level", "info"],
        controller.log_dir, cwd=controller.root, env=cli_env(),
    )
    g.start()
    try:
        g.wait_for_log("--client-auth none")
        g.wait_for_port(port)
        with httpx.Client(verify=certs.client_context(), trust_env=False, timeout=10) as c:
            r = c.get(f"https://localhost:{port}/health")
        assert r.status_code == 502, r.text  # no certificate needed: the request reaches the (absent) backend
    finally:
        g.stop()
