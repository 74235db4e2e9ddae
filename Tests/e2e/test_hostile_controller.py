"""Hostile input to the controller's one port, through the real binary: garbage and abandoned TLS, certificates it
must not accept (another CA, a deleted, revoked or disabled identity), identities used for what their role may not
do (a device on the admin API, a device hosting), broken enrollment tokens of every kind, and hostile output paths.

Every refusal is checked for what it must not have done too: the store row is unchanged, no file was written, the
backend heard nothing; and the controller still serves a good request afterwards.

Broken tokens are *signed with the controller's own token key* (read from its state directory) wherever the field
itself is what is broken, so the refusal is shown to come from that field's check and not merely from a bad
signature. They go straight to `POST /v1/enroll` with a valid proof of possession, so the controller's own checks
are tested, whatever a client would have caught first.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import http.client
import json
import os
import socket
import ssl
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from conftest import Controller, ManagedProcess, cli_env
from hostile import assert_no_growth, fd_count, read_until_closed, rss_bytes, send_raw
from test_hostile_http import TLS_GARBAGE
from test_overlay import SERVICE, enroll

pytestmark = pytest.mark.e2e

CLOSE_BOUND_S = 10.0
HANDSHAKE_TIMEOUT_S = 10.0  # the controller's TLS handshake deadline (ControllerServer.defaultHandshakeTimeout)
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


# ------------------------------------------------------------------------------------------------------------------
# Helpers: TLS as a given identity, the admin API, the store
# ------------------------------------------------------------------------------------------------------------------


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def identity_file(c: Controller, name: str) -> dict:
    return json.loads((c.root / "identities" / f"{name}.json").read_text())


def pem_files(c: Controller, name: str) -> tuple[Path, Path]:
    """An identity's certificate and key as PEM files, kept outside the controller's working directory."""
    data = identity_file(c, name)
    d = c.log_dir / f"pem-{name}-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    (d / "cert.pem").write_text(data["certificate"])
    (d / "key.pem").write_text(data["privateKey"])
    os.chmod(d / "key.pem", 0o600)
    return d / "cert.pem", d / "key.pem"


def tls_context(c: Controller, creds: Optional[tuple[Path, Path]], alpn: str = "http/1.1") -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile=str(c.state_dir / "ca.pem"))
    if creds is not None:
        ctx.load_cert_chain(str(creds[0]), str(creds[1]))
    ctx.set_alpn_protocols([alpn])
    return ctx


def api(c: Controller, method: str, path: str, creds: Optional[tuple[Path, Path]], body: Optional[dict] = None
        ) -> tuple[int, dict]:
    """One admin-API call; (status, JSON body), or (0, {"tls": reason}) if TLS itself refused the certificate."""
    conn = http.client.HTTPSConnection("127.0.0.1", c.port, context=tls_context(c, creds), timeout=10)
    try:
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        conn.request(method, path, body=payload, headers=headers)
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if raw else {})
    except (ssl.SSLError, ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected) as e:
        return 0, {"tls": repr(e)}
    finally:
        conn.close()


def h2_outcome(c: Controller, creds: Optional[tuple[Path, Path]], alpn: str) -> str:
    """Opens an overlay connection (ALPN ils-dial/1 or ils-host/1) with the HTTP/2 preface and says what came back:
    "settings" as soon as the controller speaks HTTP/2 with us (accepted), otherwise how it refused."""
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    try:
        tls = tls_context(c, creds, alpn).wrap_socket(raw, server_hostname="127.0.0.1")
    except (ssl.SSLError, ConnectionResetError) as e:
        raw.close()
        return f"refused in the handshake: {e!r}"
    try:
        try:
            tls.sendall(H2_PREFACE)
        except (ssl.SSLError, OSError) as e:
            return f"refused: {e!r}"
        data = b""
        deadline = time.monotonic() + CLOSE_BOUND_S
        while time.monotonic() < deadline:
            tls.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = tls.recv(65536)
            except socket.timeout:
                break
            except (ssl.SSLError, OSError) as e:
                return f"refused: {e!r} after {data[:100]!r}"
            if not chunk:
                return f"refused: closed after {data[:100]!r}"
            data += chunk
            # The controller is the HTTP/2 client on a hosting connection: it starts with its own preface.
            frames = data[24:] if data.startswith(b"PRI * HTTP/2.0") else data
            if len(frames) >= 9:
                return "settings" if frames[3] == 0x04 else f"refused: first frame {frames[:9]!r}"
        return f"refused: nothing within {CLOSE_BOUND_S} s"
    finally:
        tls.close()


def h2_host_outcome(c: Controller, creds: tuple[Path, Path]) -> str:
    """Opens a gateway connection (ils-host/1), answers the controller's control stream as a gateway that hosts
    claude-api, and says what came back: "told identity_blocked, then closed" when the controller's answer on the
    control stream was a refusal of the identity (errorCode identity_blocked) and it closed the connection; "bound"
    when it sent a dial policy; "refused: ..." when it never got that far."""
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    try:
        tls = tls_context(c, creds, "ils-host/1").wrap_socket(raw, server_hostname="127.0.0.1")
    except (ssl.SSLError, ConnectionResetError) as e:
        raw.close()
        return f"refused in the handshake: {e!r}"
    # The gateway is the HTTP/2 server here: its preface is a SETTINGS frame.
    frame = lambda kind, flags, stream, payload: (len(payload).to_bytes(3, "big") + bytes([kind, flags])
                                                  + stream.to_bytes(4, "big") + payload)
    try:
        tls.sendall(frame(0x4, 0, 0, b""))
        data, answered, body = b"", False, b""
        deadline = time.monotonic() + CLOSE_BOUND_S
        while time.monotonic() < deadline:
            tls.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = tls.recv(65536)
            except socket.timeout:
                break
            except (ssl.SSLError, OSError):
                chunk = b""
            if not chunk:
                if b'"errorCode":"identity_blocked"' in body:
                    return "told identity_blocked, then closed"
                return f"refused: closed after {body[:200]!r}"
            data += chunk
            if data.startswith(b"PRI * HTTP/2.0"):
                data = data[24:]
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                length, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
                stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
                payload, data = data[9:9 + length], data[9 + length:]
                if kind == 0x4 and not flags & 0x1:
                    tls.sendall(frame(0x4, 0x1, 0, b""))  # SETTINGS ack
                elif kind == 0x1 and stream == 1 and not answered:
                    # :status 200 (static index 8), then ils-service: claude-api as a literal (RFC 7541 §6.2.2).
                    block = b"\x88" + b"\x00\x0bils-service\x0aclaude-api"
                    tls.sendall(frame(0x1, 0x4, 1, block))
                    answered = True
                elif kind == 0x0 and stream == 1:
                    body += payload
                    if b'"dialRoles"' in body:
                        return "bound"
        return f"refused: nothing conclusive within {CLOSE_BOUND_S} s ({body[:200]!r})"
    finally:
        tls.close()


def h2_dial_outcome(c: Controller, creds: tuple[Path, Path]) -> str:
    """Opens a device connection (ils-dial/1), asks for a circuit (CONNECT claude-api, stream 1) and says what came
    back: "circuit refused, then closed" when the controller answered the CONNECT with a final non-200 head and closed
    the connection; "circuit answered 200" or "no refusal ..." otherwise; "refused: ..." when it never spoke HTTP/2."""
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    try:
        tls = tls_context(c, creds, "ils-dial/1").wrap_socket(raw, server_hostname="127.0.0.1")
    except (ssl.SSLError, ConnectionResetError) as e:
        raw.close()
        return f"refused in the handshake: {e!r}"
    # HPACK literals without indexing, indexed names (:method = 2, :authority = 1), no Huffman.
    block = b"\x02\x07CONNECT" + b"\x01\x0aclaude-api"
    headers = len(block).to_bytes(3, "big") + b"\x01\x04" + (1).to_bytes(4, "big") + block  # END_HEADERS
    try:
        tls.sendall(H2_PREFACE + headers)
        data, answer, closed = b"", None, False
        deadline = time.monotonic() + CLOSE_BOUND_S
        while time.monotonic() < deadline and not closed:
            tls.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                chunk = tls.recv(65536)
            except socket.timeout:
                break
            except (ssl.SSLError, OSError):
                chunk = b""
            if not chunk:
                closed = True
            data += chunk
            while len(data) >= 9 and len(data) >= 9 + int.from_bytes(data[:3], "big"):
                length, kind, flags = int.from_bytes(data[:3], "big"), data[3], data[4]
                stream = int.from_bytes(data[5:9], "big") & 0x7FFFFFFF
                if kind == 0x01 and stream == 1 and answer is None:
                    answer = (data[9:9 + length], flags)
                data = data[9 + length:]
        if answer is None:
            return f"no answer to the CONNECT ({'closed' if closed else 'still open'})"
        block, flags = answer
        if block[:1] == b"\x88":  # static table entry 8: ":status 200"
            return "circuit answered 200"
        if not flags & 0x01:
            return "no refusal: the answer did not end the stream"
        return "circuit refused, then closed" if closed else "circuit refused, connection left open"
    finally:
        tls.close()


def store_row(c: Controller, name: str) -> tuple:
    import sqlite3

    db = sqlite3.connect(f"file:{c.state_dir / 'store.sqlite'}?mode=ro", uri=True, timeout=10)
    try:
        identity = db.execute(
            "SELECT id, role, state, cert_fingerprint, public_key FROM identities WHERE name = ?", (name,)
        ).fetchone()
        tokens = db.execute(
            "SELECT jti, consumed_at FROM enrollment_tokens WHERE identity_id = ? ORDER BY jti",
            (identity[0] if identity else "",),
        ).fetchall()
        return identity, tuple(tokens)
    finally:
        db.close()


def identities_snapshot(c: Controller, admin: tuple[Path, Path]) -> list:
    status, body = api(c, "GET", "/v1/admin/identities", admin)
    assert status == 200, body
    return sorted(({k: v for k, v in e.items() if k != "lastSeenAt"} for e in body), key=lambda e: e["name"])


def assert_controller_serves(c: Controller, admin: tuple[Path, Path]) -> None:
    assert c.process is not None and c.process.alive(), f"the controller exited:\n{c.logs()}"
    status, body = api(c, "GET", "/v1/whoami", admin)
    assert status == 200 and body["name"] == "admin", (status, body)


@pytest.fixture(scope="module")
def admin(controller: Controller) -> tuple[Path, Path]:
    return pem_files(controller, "admin")


def make_token(c: Controller, name: str, role: str = "device") -> str:
    r = c.cli("admin", "identity", "create", name, "--role", role, "-o", f"{name}.jwt")
    assert r.returncode == 0, r.describe()
    return (c.root / f"{name}.jwt").read_text().strip()


# ------------------------------------------------------------------------------------------------------------------
# Garbage and abandoned TLS at the port
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name,payload", TLS_GARBAGE, ids=[n for n, _ in TLS_GARBAGE])
def test_garbage_at_the_controller_port_is_dropped(controller: Controller, admin, name: str, payload: bytes) -> None:
    out = send_raw(controller.port, payload, deadline_s=HANDSHAKE_TIMEOUT_S + CLOSE_BOUND_S, shut_write=True)
    print(f"{name}: {out.describe()}")
    assert out.closed, f"{name}: the controller kept the connection open: {out.describe()}"
    assert out.responses == 0
    assert_controller_serves(controller, admin)


def test_abandoned_handshakes_are_closed(controller: Controller, admin) -> None:
    """Connections that send nothing, or half a ClientHello, and then wait: each is closed after the handshake
    deadline, and the controller serves meanwhile (they do not pile up for ever on its one port)."""
    socks = [socket.create_connection(("127.0.0.1", controller.port), timeout=5) for _ in range(40)]
    try:
        for s in socks[::2]:
            s.sendall(TLS_GARBAGE[2][1])  # a truncated ClientHello
        assert_controller_serves(controller, admin)
        started = time.monotonic()
        still_open = 0
        for s in socks:
            left = max(0.1, HANDSHAKE_TIMEOUT_S + CLOSE_BOUND_S - (time.monotonic() - started))
            if not read_until_closed(s, deadline_s=left).closed:
                still_open += 1
        elapsed = time.monotonic() - started
        print(f"40 abandoned handshakes: {40 - still_open} closed by the controller within {elapsed:.1f} s")
        assert still_open == 0, f"{still_open} abandoned handshakes still open after {elapsed:.1f} s"
    finally:
        for s in socks:
            s.close()
    assert_controller_serves(controller, admin)


def test_hostile_connections_leave_no_memory_or_descriptors_behind(controller: Controller, admin) -> None:
    pid = controller.process.pid

    def round_of_abuse() -> None:
        for _, payload in TLS_GARBAGE:
            send_raw(controller.port, payload, deadline_s=CLOSE_BOUND_S, shut_write=True)
        for alpn in ("http/1.1", "ils-dial/1", "ils-host/1"):
            h2_outcome(controller, None, alpn)  # a completed handshake without a client certificate

    round_of_abuse()
    assert_controller_serves(controller, admin)
    rss0, fds0 = rss_bytes(pid), fd_count(pid)
    rounds = 15
    for _ in range(rounds):
        round_of_abuse()
    assert_controller_serves(controller, admin)
    assert_no_growth("controller", pid, (rss0, fds0), f"{rounds * (len(TLS_GARBAGE) + 3)} hostile connections")


API_ABUSE: list[tuple[str, bytes]] = [
    ("enroll body over 64 KiB", b"POST /v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
     b"Content-Length: 100000\r\n\r\n" + b"a" * 100000),
    ("chunked enroll body over 64 KiB", b"POST /v1/enroll HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + (b"8000\r\n" + b"a" * 0x8000 + b"\r\n") * 4 + b"0\r\n\r\n"),
    ("enroll body that is not JSON",
     b"POST /v1/enroll HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 9\r\n\r\nnot json!"),
    ("enroll body of the wrong types",
     b'POST /v1/enroll HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 40\r\n\r\n'
     b'{"token":1,"publicKey":[],"proof":{}}   '),
    ("CL+TE smuggling", b"POST /v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"0\r\n\r\nGET /v1/admin/identities HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("admin API without a certificate", b"GET /v1/admin/identities HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("dot-dot path", b"GET /v1/../../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    ("10000 header fields", b"GET /v1/enroll/info HTTP/1.1\r\nHost: x\r\n"
     + b"".join(b"X-F%d: v\r\n" % i for i in range(10000)) + b"\r\n"),
]


@pytest.mark.parametrize("name,payload", API_ABUSE, ids=[n for n, _ in API_ABUSE])
def test_abusive_requests_to_the_unauthenticated_api(controller: Controller, admin, name: str,
                                                     payload: bytes) -> None:
    """The enrollment API answers anyone: abusive requests over TLS without a client certificate get one 4xx JSON
    error (or a close), never a 2xx, never a second (smuggled) answer, and change nothing."""
    before = identities_snapshot(controller, admin)
    raw = socket.create_connection(("127.0.0.1", controller.port), timeout=5)
    tls = tls_context(controller, None).wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        try:
            tls.sendall(payload)
        except (ssl.SSLError, OSError):
            pass  # the controller may close before taking it all
        out = read_until_closed(tls, deadline_s=CLOSE_BOUND_S)
    finally:
        tls.close()
    print(f"{name}: {out.describe()}")
    assert out.responses <= 1, f"{name}: more than one response, a request was smuggled: {out.describe()}"
    if out.data:
        assert out.status is not None and 400 <= out.status < 500, f"{name}: {out.describe()}"
        if out.body:
            assert out.body.lstrip().startswith(b"{"), f"{name}: not a JSON error: {out.describe()}"
    assert identities_snapshot(controller, admin) == before
    assert_controller_serves(controller, admin)


# ------------------------------------------------------------------------------------------------------------------
# Certificates the controller must not accept
# ------------------------------------------------------------------------------------------------------------------


def forged_admin_certificate(c: Controller, directory: Path) -> tuple[Path, Path]:
    """A certificate that copies the admin identity's subject and identity URI exactly, for a key of our own, signed
    by a CA of our own (Ed25519, like the controller's identity certificates)."""
    real = x509.load_pem_x509_certificate(identity_file(c, "admin")["certificate"].encode())
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = Ed25519PrivateKey.generate()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ils-gateway controller CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, None)
    )
    key = Ed25519PrivateKey.generate()
    builder = (
        x509.CertificateBuilder().subject_name(real.subject).issuer_name(ca.subject).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for ext in real.extensions:
        if ext.oid in (x509.oid.ExtensionOID.SUBJECT_ALTERNATIVE_NAME, x509.oid.ExtensionOID.EXTENDED_KEY_USAGE,
                       x509.oid.ExtensionOID.KEY_USAGE, x509.oid.ExtensionOID.BASIC_CONSTRAINTS):
            builder = builder.add_extension(ext.value, ext.critical)
    cert = builder.sign(ca_key, None)
    (directory / "forged.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM)
                                           + ca.public_bytes(serialization.Encoding.PEM))
    (directory / "forged.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return directory / "forged.pem", directory / "forged.key"


def test_certificate_from_another_ca_is_refused(controller: Controller, admin) -> None:
    d = controller.log_dir / f"forged-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    forged = forged_admin_certificate(controller, d)
    before = identities_snapshot(controller, admin)
    status, body = api(controller, "GET", "/v1/admin/identities", forged)
    print(f"admin API with a look-alike admin certificate from another CA: {status} {body}")
    assert status in (0, 403), (status, body)
    status, body = api(controller, "POST", "/v1/admin/identities", forged,
                       {"name": "forged-made", "role": "admin", "attributes": [], "tokenLifetimeSeconds": 60})
    assert status in (0, 403), (status, body)
    for alpn in ("ils-dial/1", "ils-host/1"):
        outcome = h2_outcome(controller, forged, alpn)
        print(f"{alpn} with a certificate from another CA: {outcome}")
        assert outcome != "settings", f"{alpn}: the controller accepted a certificate from another CA"
    assert identities_snapshot(controller, admin) == before
    assert_controller_serves(controller, admin)


@pytest.fixture(scope="module")
def fallen(controller: Controller) -> dict[str, tuple[Path, Path]]:
    """Four enrolled devices; three of them then revoked, disabled and deleted. Their certificates are kept."""
    creds = {}
    for name in ("dev-ok", "dev-revoked", "dev-disabled", "dev-deleted"):
        enroll(controller, name, "device")
        creds[name] = pem_files(controller, name)
    for verb, name in (("revoke", "dev-revoked"), ("disable", "dev-disabled"), ("delete", "dev-deleted")):
        r = controller.cli("admin", "identity", verb, name)
        assert r.returncode == 0, r.describe()
    return creds


@pytest.mark.parametrize("name", ["dev-revoked", "dev-disabled", "dev-deleted"])
def test_certificate_of_a_fallen_identity_is_refused(controller: Controller, admin, fallen, name: str) -> None:
    # Positive control: the same checks accept the device that is still active.
    status, body = api(controller, "GET", "/v1/whoami", fallen["dev-ok"])
    assert status == 200 and body["name"] == "dev-ok", (status, body)
    assert h2_outcome(controller, fallen["dev-ok"], "ils-dial/1") == "settings"

    row = store_row(controller, name)
    status, body = api(controller, "GET", "/v1/whoami", fallen[name])
    print(f"whoami as {name}: {status} {body}")
    assert status in (0, 403), (status, body)
    if status == 403:
        assert body.get("code") == "permission_denied", body
    status, body = api(controller, "POST", "/v1/renew", fallen[name], {"publicKey": b64url(os.urandom(32)),
                                                                       "proof": b64url(os.urandom(64))})
    assert status in (0, 403), (status, body)
    # A gateway link is told why on its control stream (identity_blocked), then closed; it never binds.
    outcome = h2_host_outcome(controller, fallen[name])
    print(f"ils-host/1 as {name}: {outcome}")
    assert outcome == "told identity_blocked, then closed", f"ils-host/1 as {name}: {outcome}"
    # A device is told why on its first circuit request (403 identity_blocked), then the connection closes; no
    # circuit is ever relayed for it.
    outcome = h2_dial_outcome(controller, fallen[name])
    print(f"ils-dial/1 as {name}: {outcome}")
    assert outcome == "circuit refused, then closed", f"ils-dial/1 as {name}: {outcome}"
    assert store_row(controller, name) == row, f"a refused {name} changed its store row"
    assert_controller_serves(controller, admin)


# ------------------------------------------------------------------------------------------------------------------
# Roles used for what they may not do
# ------------------------------------------------------------------------------------------------------------------

ADMIN_CALLS = [
    ("GET", "/v1/admin/identities", None),
    ("POST", "/v1/admin/identities", {"name": "escalated", "role": "admin", "attributes": [],
                                      "tokenLifetimeSeconds": 60}),
    ("GET", "/v1/admin/identities/admin", None),
    ("DELETE", "/v1/admin/identities/dev-ok", None),
    ("POST", "/v1/admin/identities/admin/reissue", {"tokenLifetimeSeconds": 60}),
    ("POST", "/v1/admin/identities/dev-ok/revoke", None),
    ("POST", "/v1/admin/identities/dev-ok/disable", None),
    ("POST", "/v1/admin/identities/dev-ok/enable", None),
    ("GET", "/v1/admin/sessions", None),
    ("GET", "/v1/admin/audit?since=0", None),
]


@pytest.mark.parametrize("role", ["device", "gateway"])
def test_admin_api_refuses_devices_and_gateways(controller: Controller, admin, fallen, role: str) -> None:
    name = f"not-admin-{role}"
    enroll(controller, name, role)
    creds = pem_files(controller, name)
    before = identities_snapshot(controller, admin)
    for method, path, body in ADMIN_CALLS:
        status, answer = api(controller, method, path, creds, body)
        assert status == 403 and answer.get("code") == "permission_denied", (method, path, status, answer)
    assert identities_snapshot(controller, admin) == before, "a refused admin call changed the identities"
    assert_controller_serves(controller, admin)


def test_serve_refuses_a_device_identity(controller: Controller, admin, fallen) -> None:
    """`serve` with a device's identity stops at once with one sentence and the permission exit status, before it
    dials anything. (The controller's own refusal of a device that hosts anyway is `DeviceHostingTests`.)"""
    enroll(controller, "dev-host", "device")
    r = controller.cli("serve", "--mode", "ziti", "--identity", "identities/dev-host.json", "--service", SERVICE,
                       "--backend", "http://127.0.0.1:9")
    print(f"serve as a device: exit {r.returncode}, {r.stderr.strip()!r}")
    assert r.returncode == 77, r.describe()
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ils-gateway: ") and "gateway" in lines[0], r.describe()
    assert_controller_serves(controller, admin)


# ------------------------------------------------------------------------------------------------------------------
# Enrollment tokens with every field broken
# ------------------------------------------------------------------------------------------------------------------


def token_key(c: Controller) -> Ed25519PrivateKey:
    key = serialization.load_pem_private_key((c.state_dir / "token.key").read_bytes(), password=None)
    assert isinstance(key, Ed25519PrivateKey)
    return key


def sign(key: Ed25519PrivateKey, header: dict | str, claims: dict | str) -> str:
    h = b64url(header.encode() if isinstance(header, str) else json.dumps(header).encode())
    p = b64url(claims.encode() if isinstance(claims, str) else json.dumps(claims).encode())
    return f"{h}.{p}.{b64url(key.sign(f'{h}.{p}'.encode()))}"


def enroll_request(token: str) -> dict:
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return {"token": token, "publicKey": b64url(public), "proof": b64url(key.sign(b"ils-enroll-v1\n" + token.encode()))}


def broken_tokens(c: Controller, good: str, other_claims: dict) -> list[tuple[str, str]]:
    """(what is broken, token). Claims-level breakage is signed with the real token key."""
    key = token_key(c)
    header = {"alg": "EdDSA", "typ": "JWT"}
    h, p, s = good.split(".")
    claims = json.loads(b64url_decode(p))
    now = int(time.time())
    out: list[tuple[str, str]] = []

    def with_claims(**changes) -> dict:
        changed = dict(claims)
        for k, v in changes.items():
            if v is ...:
                changed.pop(k)
            else:
                changed[k] = v
        return changed

    for field in ("iss", "sub", "jti", "iat", "exp", "ils_ca", "ils_name", "ils_role"):
        out.append((f"{field} missing", sign(key, header, with_claims(**{field: ...}))))
        out.append((f"{field} null", sign(key, header, with_claims(**{field: None}))))
        wrong_type = "1700000000" if field in ("iat", "exp") else 12345
        out.append((f"{field} of the wrong type", sign(key, header, with_claims(**{field: wrong_type}))))
        out.append((f"{field} an object", sign(key, header, with_claims(**{field: {"x": 1}}))))
    for field in ("iss", "sub", "jti", "ils_ca", "ils_role"):
        out.append((f"{field} empty", sign(key, header, with_claims(**{field: ""}))))
    out += [
        ("iss of another controller", sign(key, header, with_claims(iss="https://127.0.0.1:1"))),
        ("iss with a trailing slash", sign(key, header, with_claims(iss=claims["iss"] + "/"))),
        ("iss over plain http", sign(key, header, with_claims(iss=claims["iss"].replace("https", "http")))),
        ("sub of another identity", sign(key, header, with_claims(sub=other_claims["sub"]))),
        ("sub of the admin", sign(key, header, with_claims(sub=identity_file(c, "admin")["identity"]["id"]))),
        ("jti never issued", sign(key, header, with_claims(jti=b64url(os.urandom(16))))),
        ("jti of another identity's token", sign(key, header, with_claims(jti=other_claims["jti"]))),
        ("exp in the past", sign(key, header, with_claims(exp=now - 10))),
        ("exp zero", sign(key, header, with_claims(exp=0))),
        ("exp negative", sign(key, header, with_claims(exp=-(2**62)))),
        ("exp beyond 64 bits", sign(key, header, with_claims(exp=2**64 + 5))),
        ("exp fractional", sign(key, header, with_claims(exp=now + 3600.5))),
        ("ils_ca of another CA", sign(key, header, with_claims(ils_ca="ab" * 32))),
        ("ils_ca in upper case", sign(key, header, with_claims(ils_ca=claims["ils_ca"].upper()))),
        ("ils_role unknown", sign(key, header, with_claims(ils_role="root"))),
        ("payload not JSON", sign(key, header, "not json")),
        ("payload a JSON array", sign(key, header, "[1,2,3]")),
        ("header alg missing", sign(key, {"typ": "JWT"}, claims)),
        ("header alg none", sign(key, {"alg": "none"}, claims)),
        ("header alg HS256", sign(key, {"alg": "HS256"}, claims)),
        ("header alg in lower case", sign(key, {"alg": "eddsa"}, claims)),
        ("header not JSON", sign(key, "{alg:EdDSA", claims)),
        ("signature of another key", sign(Ed25519PrivateKey.generate(), header, claims)),
        ("signature empty", f"{h}.{p}."),
        ("signature one byte short", f"{h}.{p}.{b64url(b64url_decode(s)[:-1])}"),
        ("signature one byte long", f"{h}.{p}.{b64url(b64url_decode(s) + b'0')}"),
        ("signature over the payload only", f"{h}.{p}.{b64url(key.sign(p.encode()))}"),
        ("two segments", f"{h}.{p}"),
        ("four segments", f"{good}.{s}"),
        ("empty", ""),
        ("base64 padding", f"{h}=.{p}.{s}"),
        ("standard base64 alphabet", f"{h}.{p}.{s.replace('-', '+').replace('_', '/')}"
         if ("-" in s or "_" in s) else f"{h}+.{p}.{s}"),
        ("whitespace inside", f"{h}. {p}.{s}"),
        ("over 4096 bytes", sign(key, header, with_claims(ils_pad="x" * 5000))),
        ("non-ASCII", f"{h}.{p}é.{s}"),
    ]
    return out


def test_enrollment_tokens_with_every_field_broken_are_refused(controller: Controller, admin) -> None:
    good = make_token(controller, "jwt-victim")
    other = make_token(controller, "jwt-other")
    other_claims = json.loads(b64url_decode(other.split(".")[1]))
    victim_row, other_row = store_row(controller, "jwt-victim"), store_row(controller, "jwt-other")
    refused = []
    for what, token in broken_tokens(controller, good, other_claims):
        status, body = api(controller, "POST", "/v1/enroll", None, enroll_request(token))
        refused.append(f"{what}: {status} {body.get('code')}")
        assert 400 <= status < 500, f"{what}: expected a refusal, got {status} {body}"
        assert isinstance(body.get("code"), str) and body.get("error"), f"{what}: not a JSON error: {body}"
        assert "BEGIN" not in json.dumps(body), f"{what}: the refusal carried a certificate or key"
    print("\n".join(refused))
    assert store_row(controller, "jwt-victim") == victim_row, "a refused token changed the victim's store row"
    assert store_row(controller, "jwt-other") == other_row, "a refused token changed another identity's row"
    # Nothing was spent: both genuine tokens still enroll.
    mark = len(controller.process.full_log())
    for token in (good, other):
        status, body = api(controller, "POST", "/v1/enroll", None, enroll_request(token))
        assert status == 200, (status, body)
    # Their lines come after the refusals' (the binary writes its lines a little late): they fence the check.
    controller.process.wait_for_log_count("enrolled", count=2, after=mark)
    log = controller.process.full_log()
    for secret in (good.split(".")[2], other.split(".")[2], "PRIVATE KEY"):
        assert secret not in log, "the controller logged a token signature or a key while refusing tokens"
    assert_controller_serves(controller, admin)


def test_a_token_claiming_another_role_enrolls_the_stored_role(controller: Controller) -> None:
    """`ils_role` and `ils_name` are for display: a token re-signed to say admin enrolls the stored device role."""
    good = make_token(controller, "jwt-role")
    claims = json.loads(b64url_decode(good.split(".")[1]))
    claims.update(ils_role="admin", ils_name="admin")
    status, body = api(controller, "POST", "/v1/enroll", None,
                       enroll_request(sign(token_key(controller), {"alg": "EdDSA", "typ": "JWT"}, claims)))
    assert status == 200, body
    assert body["identity"]["role"] == "device" and body["identity"]["name"] == "jwt-role", body["identity"]
    cert = x509.load_pem_x509_certificate(body["certificate"].encode())
    assert "OU=device" in cert.subject.rfc4514_string(), cert.subject.rfc4514_string()


# ------------------------------------------------------------------------------------------------------------------
# Hostile paths on the device: identity names in tokens, --out
# ------------------------------------------------------------------------------------------------------------------


def listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("name", ["../../escaped", "/tmp/absolute", "a/../../b", "..", ".hidden", "x\u0000y"])
def test_identity_name_in_a_token_cannot_steer_the_identity_file(controller: Controller, name: str) -> None:
    """A token signed by the controller's key whose ils_name is a path: enroll refuses before touching the network
    or the disk, and the token is not spent."""
    good = make_token(controller, f"path-{uuid.uuid4().hex[:6]}")
    claims = json.loads(b64url_decode(good.split(".")[1]))
    claims["ils_name"] = name
    forged = sign(token_key(controller), {"alg": "EdDSA", "typ": "JWT"}, claims)
    # Where a naive `identities/NAME.json` would have landed.
    escape = Path(os.path.normpath(controller.root / "identities" / f"{name.replace(chr(0), '')}.json"))
    existed = escape.exists()
    before_root = listing(controller.root)
    row = store_row(controller, json.loads(b64url_decode(good.split(".")[1]))["ils_name"])
    r = controller.cli("enroll", forged)
    print(f"ils_name {name!r}: exit {r.returncode}, {r.stderr.strip()!r}")
    assert r.returncode != 0 and r.stderr.startswith("ils-gateway: "), r.describe()
    assert r.returncode != 1, f"a crash, not a refusal: {r.describe()}"
    assert listing(controller.root) == before_root
    assert escape.exists() == existed, f"enroll wrote {escape}"
    assert store_row(controller, json.loads(b64url_decode(good.split(".")[1]))["ils_name"]) == row


def test_out_through_a_planted_symlink_does_not_write_through_it(controller: Controller) -> None:
    """Someone planted identities/x.json as a symlink to a file of theirs (or a dangling one). Enrolling with
    --out at that path must not write the private key through the link into the target."""
    victim = controller.log_dir / f"victim-{uuid.uuid4().hex[:6]}"
    victim.write_text("precious\n")
    dangling = controller.log_dir / f"nothing-{uuid.uuid4().hex[:6]}"
    for target, force in ((victim, True), (dangling, False)):
        token = make_token(controller, f"sym-{uuid.uuid4().hex[:6]}")
        link = controller.root / f"planted-{uuid.uuid4().hex[:6]}.json"
        link.symlink_to(target)
        args = ["enroll", token, "--out", link.name] + (["--force"] if force else [])
        r = controller.cli(*args)
        print(f"--out symlink to {'a file' if force else 'nothing'}{' --force' if force else ''}: "
              f"exit {r.returncode}, {r.stderr.strip()!r}")
        assert r.returncode != 1, f"a crash, not a refusal: {r.describe()}"
        assert victim.read_text() == "precious\n", "enroll wrote through a planted symlink"
        assert not dangling.exists(), "enroll created the dangling symlink's target"
        if r.returncode == 0:
            assert not link.is_symlink() and json.loads(link.read_text())["privateKey"], "not a regular file"
            assert (link.stat().st_mode & 0o777) == 0o600


def test_out_at_a_dangling_symlink_is_refused_before_the_token_is_spent(controller: Controller) -> None:
    name = f"sym-{uuid.uuid4().hex[:6]}"
    token = make_token(controller, name)
    link = controller.root / f"planted-{uuid.uuid4().hex[:6]}.json"
    link.symlink_to(controller.log_dir / f"nothing-{uuid.uuid4().hex[:6]}")
    row = store_row(controller, name)
    r = controller.cli("enroll", token, "--out", link.name)
    assert r.returncode != 0 and r.returncode != 1, r.describe()
    assert store_row(controller, name) == row, f"the refused enroll spent the token: {r.stderr.strip()!r}"


def test_a_controller_that_hangs_up_mid_handshake_is_reported_unreachable(controller: Controller) -> None:
    """Something at the token's address takes the ClientHello and hangs up. The token was not spent, so the right
    answer is "unreachable, try again" (69), not "this token pins another CA" (87), which sends people hunting for
    a forged token."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    listener.settimeout(20)
    port = listener.getsockname()[1]

    def hang_up() -> None:
        try:
            while True:
                conn, _ = listener.accept()
                conn.recv(4096)
                conn.close()
        except OSError:
            pass

    import threading

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        token = make_token(controller, f"hangup-{uuid.uuid4().hex[:6]}")
        h, p, s = token.split(".")
        claims = json.loads(b64url_decode(p))
        claims["iss"] = f"https://127.0.0.1:{port}"
        r = controller.cli("enroll", f"{h}.{b64url(json.dumps(claims).encode())}.{s}", "--out", "hangup.json")
        print(f"enroll against a hang-up: exit {r.returncode}, {r.stderr.strip()!r}")
        assert r.returncode == 69, r.describe()
    finally:
        listener.close()


# ------------------------------------------------------------------------------------------------------------------
# Slowloris on the API: a request head or body trickled a piece at a time
# ------------------------------------------------------------------------------------------------------------------

REQUEST_TIMEOUT_S = 3.0  # --request-head-timeout and --request-body-timeout of the tuned controller
TRICKLE_INTERVAL_S = 1.0
TRICKLE_PIECES = 30  # 30 s of trickle: ten deadlines' worth, and past the old 30 s read timeout's reach per byte


class TunedController(Controller):
    """A controller of a test's own, run with extra `controller run` flags (short deadlines, small caps)."""

    def __init__(self, binary: Path, root: Path, log_dir: Path, extra: list[str]) -> None:
        super().__init__(binary, root, log_dir)
        self.extra = extra
        self.metrics_port = 0

    def start(self) -> None:
        self.process = ManagedProcess(
            "controller-tuned",
            [str(self.binary), "controller", "run", "--state-dir", str(self.state_dir),
             "--listen", f"127.0.0.1:{self.port}", "--log-level", "info", *self.extra],
            self.log_dir,
            cwd=self.root,
            env=cli_env(),
        )
        self.process.start()
        self.process.wait_for_port(self.port)

    @classmethod
    @contextlib.contextmanager
    def running(cls, binary: Path, extra: list[str]) -> Iterator["TunedController"]:
        import shutil
        import tempfile

        with tempfile.TemporaryDirectory(prefix="ils-ctl-tuned-harness-") as harness, \
                tempfile.TemporaryDirectory(prefix="ils-ctl-tuned-") as root:
            copy = Path(harness) / "ils-gateway"
            shutil.copy2(binary, copy)
            c = cls(copy, Path(root), Path(harness), extra)
            c.init_result = c.init()
            assert c.init_result.returncode == 0, c.init_result.describe()
            c.start()
            try:
                yield c
            finally:
                c.stop()


@pytest.fixture(scope="module")
def slow_api_controller(ils_bin: Path) -> Iterator[TunedController]:
    with TunedController.running(ils_bin, [f"--request-head-timeout={REQUEST_TIMEOUT_S:g}s",
                                           f"--request-body-timeout={REQUEST_TIMEOUT_S:g}s"]) as c:
        yield c


def trickle(c: Controller, first: bytes, piece: bytes) -> tuple[int, float, bytes, bool]:
    """Sends `first` over TLS, then `piece` every TRICKLE_INTERVAL_S until the controller closes (or TRICKLE_PIECES
    went by). Returns (pieces sent, seconds from the first byte to the close, what came back, closed)."""
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    tls = tls_context(c, None).wrap_socket(raw, server_hostname="127.0.0.1")
    data, sent, closed = b"", 0, False
    started = time.monotonic()
    try:
        tls.sendall(first)
        while sent < TRICKLE_PIECES and not closed:
            tls.settimeout(TRICKLE_INTERVAL_S)
            try:
                chunk = tls.recv(65536)
                data += chunk
                closed = chunk == b""
            except socket.timeout:
                try:
                    tls.sendall(piece)
                    sent += 1
                except (ssl.SSLError, OSError):
                    closed = True
            except (ssl.SSLError, OSError):
                closed = True
        if not closed:
            out = read_until_closed(tls, deadline_s=CLOSE_BOUND_S)
            data, closed = data + out.data, out.closed
        return sent, time.monotonic() - started, data, closed
    finally:
        tls.close()


def test_a_trickled_request_head_is_answered_408_at_its_deadline(slow_api_controller: TunedController) -> None:
    """One header line a second: before fixed deadlines every byte reset a 30 s read timeout, and the connection
    stayed open as long as the trickle went on. Now the head is due 3 s after the first byte, however it trickles."""
    c = slow_api_controller
    admin = pem_files(c, "admin")
    sent, elapsed, data, closed = trickle(c, b"GET /v1/enroll/info HTTP/1.1\r\nHost: x\r\n", b"X-Trickle: x\r\n")
    print(f"head trickle: {sent} lines sent, closed={closed} after {elapsed:.1f} s: {data[:200]!r}")
    assert closed and sent < TRICKLE_PIECES, f"the trickle kept the connection open for {elapsed:.0f} s"
    assert elapsed < REQUEST_TIMEOUT_S + CLOSE_BOUND_S, f"closed only after {elapsed:.1f} s"
    assert data.startswith(b"HTTP/1.1 408 "), data[:300]
    assert b'"code":"request_timeout"' in data, data[:300]
    assert_controller_serves(c, admin)


def test_a_trickled_enrollment_body_is_answered_408_and_spends_nothing(slow_api_controller: TunedController) -> None:
    """One body byte a second of a genuine enrollment: 408 once the body is 3 s late; the token stays unspent (the
    store row is unchanged) and enrolls afterwards."""
    c = slow_api_controller
    admin = pem_files(c, "admin")
    token = make_token(c, "trickle-body")
    row = store_row(c, "trickle-body")
    body = json.dumps(enroll_request(token)).encode()
    head = (b"POST /v1/enroll HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    sent, elapsed, data, closed = trickle(c, head + body[:10], b" ")
    print(f"body trickle: {sent} bytes sent, closed={closed} after {elapsed:.1f} s: {data[:200]!r}")
    assert closed and sent < TRICKLE_PIECES, f"the trickle kept the connection open for {elapsed:.0f} s"
    assert elapsed < REQUEST_TIMEOUT_S + CLOSE_BOUND_S, f"closed only after {elapsed:.1f} s"
    assert data.startswith(b"HTTP/1.1 408 "), data[:300]
    assert store_row(c, "trickle-body") == row, "the cut enrollment changed the store"
    status, answer = api(c, "POST", "/v1/enroll", None, enroll_request(token))
    assert status == 200, (status, answer)
    assert_controller_serves(c, admin)


def test_a_connection_that_sends_nothing_after_tls_is_closed_without_an_answer(
        slow_api_controller: TunedController) -> None:
    c = slow_api_controller
    raw = socket.create_connection(("127.0.0.1", c.port), timeout=5)
    tls = tls_context(c, None).wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        out = read_until_closed(tls, deadline_s=REQUEST_TIMEOUT_S + CLOSE_BOUND_S)
    finally:
        tls.close()
    print(f"silent API connection: {out.describe()}")
    assert out.closed and out.responses == 0, out.describe()
