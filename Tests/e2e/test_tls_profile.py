"""The TLS profile of both listening endpoints, as a scanner sees it (issue #23, item 9): sslyze (PyPI) enumerates
every suite each protocol version accepts on HTTP mode (`serve --mode http` with TLS) and on the controller's port,
and the test fails on
- any protocol below TLS 1.2 (SSL 2.0/3.0, TLS 1.0/1.1);
- any CBC suite (LUCKY13 and friends), any suite that is not AEAD, any TLS 1.2 key exchange without forward secrecy;
- a TLS 1.2 endpoint whose choice follows the client's order (no server cipher order).

Server order is probed the way testssl.sh does it: two handshakes offering the accepted TLS 1.2 suites in opposite
orders; a server with an order of its own picks the same suite both times. An endpoint that accepts one TLS 1.2 suite
has nothing to order and passes (whatever the client lists, there is one answer). A TLS-1.3-only endpoint (the
controller) passes the order check as moot: TLS 1.3 has only AEAD suites with an ephemeral key exchange (RFC 8446
§9.1), so whichever a client prefers is a strong one; the test checks instead that it accepts no TLS 1.2 at all.

Skips, saying why, when sslyze is not installed (`python3 -m pip install sslyze`).
"""

from __future__ import annotations

import socket
import ssl
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Backend, Certs, Gateway

pytestmark = pytest.mark.e2e

sslyze = pytest.importorskip("sslyze", reason="sslyze is not installed (python3 -m pip install sslyze)")

BELOW_1_2 = ("SSL_2_0_CIPHER_SUITES", "SSL_3_0_CIPHER_SUITES", "TLS_1_0_CIPHER_SUITES", "TLS_1_1_CIPHER_SUITES")
AEAD_MARKERS = ("_GCM_", "_CHACHA20_POLY1305_", "_CCM")


def scan(port: int) -> dict[str, list]:
    """Accepted suites per protocol version: {"TLS_1_2_CIPHER_SUITES": [CipherSuiteAcceptedByServer, ...], ...}."""
    commands = {getattr(sslyze.ScanCommand, name) for name in (*BELOW_1_2, "TLS_1_2_CIPHER_SUITES",
                                                                "TLS_1_3_CIPHER_SUITES")}
    scanner = sslyze.Scanner()
    scanner.queue_scans([sslyze.ServerScanRequest(
        server_location=sslyze.ServerNetworkLocation(hostname="127.0.0.1", port=port),
        scan_commands=commands,
    )])
    results = list(scanner.get_results())
    assert len(results) == 1
    result = results[0]
    assert result.scan_status == sslyze.ServerScanStatusEnum.COMPLETED, \
        f"sslyze could not connect: {result.connectivity_error_trace}"
    accepted: dict[str, list] = {}
    for command in commands:
        attempt = getattr(result.scan_result, command.value)
        assert attempt.status == sslyze.ScanCommandAttemptStatusEnum.COMPLETED, \
            f"{command.value}: {attempt.error_reason} {attempt.error_trace}"
        accepted[command.name] = list(attempt.result.accepted_cipher_suites)
    return accepted


def negotiated_tls12(port: int, openssl_names: list[str]) -> str:
    """The suite the server picks from a TLS 1.2 ClientHello that lists `openssl_names` in this order."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.minimum_version = ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(":".join(openssl_names))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return tls.cipher()[0]


def profile_problems(port: int) -> tuple[list[str], dict[str, list[str]]]:
    """(what is wrong, accepted suite names per version) for the endpoint on `port`."""
    accepted = scan(port)
    names = {version: [s.cipher_suite.name for s in suites] for version, suites in accepted.items()}
    problems = [f"{version} accepted: {names[version]}" for version in BELOW_1_2 if names[version]]
    for version in ("TLS_1_2_CIPHER_SUITES", "TLS_1_3_CIPHER_SUITES"):
        for name in names[version]:
            if "_CBC_" in name:
                problems.append(f"CBC suite {name} ({version})")
            elif not any(marker in name for marker in AEAD_MARKERS):
                problems.append(f"non-AEAD suite {name} ({version})")
            if version == "TLS_1_2_CIPHER_SUITES" and not name.startswith(("TLS_ECDHE_", "TLS_DHE_")):
                problems.append(f"TLS 1.2 suite without forward secrecy: {name}")
    tls12 = [s.cipher_suite.openssl_name for s in accepted["TLS_1_2_CIPHER_SUITES"]]
    # Python's OpenSSL can only offer what it knows; the accepted suites of a sane profile are all in it.
    if len(tls12) >= 2:
        forward = negotiated_tls12(port, tls12)
        backward = negotiated_tls12(port, list(reversed(tls12)))
        print(f"server order probe: {tls12} -> {forward}; reversed -> {backward}")
        if forward != backward:
            problems.append(f"no server cipher order: the client's first choice won both times ({forward}, {backward})")
    return problems, names


@pytest.fixture(scope="module")
def tls_gateway(ils_bin: Path, backend: Backend, certs: Certs, work_dir: Path) -> Iterator[Gateway]:
    g = Gateway(ils_bin, "tls", backend, certs, work_dir, [])
    g.start()
    yield g
    g.stop()


def test_http_mode_offers_tls12_and_13_with_forward_secret_aead_suites_only(tls_gateway: Gateway) -> None:
    problems, names = profile_problems(tls_gateway.port)
    print(f"HTTP mode accepts: {names}")
    assert not problems, "\n".join(problems)
    assert names["TLS_1_2_CIPHER_SUITES"], "HTTP mode must still serve TLS 1.2 clients (Mozilla intermediate)"
    assert names["TLS_1_3_CIPHER_SUITES"], "HTTP mode must serve TLS 1.3"


def test_the_controller_port_offers_tls13_only(controller) -> None:
    """Every client of the controller is ours (ILSClient, the CLI, the tunnel, the gateway: BoringSSL, TLS 1.3)."""
    problems, names = profile_problems(controller.port)
    print(f"controller accepts: {names}")
    assert not problems, "\n".join(problems)
    assert names["TLS_1_3_CIPHER_SUITES"], "the controller must serve TLS 1.3"
    assert not names["TLS_1_2_CIPHER_SUITES"], f"the controller accepts TLS 1.2: {names['TLS_1_2_CIPHER_SUITES']}"


def test_the_console_has_http_modes_profile(controller, certs: Certs) -> None:
    """Issue 37, item 4: the console under TLS offered five TLS 1.2 suites, CBC ones among them, in the client's
    order. It now has HTTP mode's profile, from the same code (`ServerTLSProfile`)."""
    from console_browser import Console

    console = Console(controller, "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key))
    console.start()
    try:
        problems, names = profile_problems(console.port)
    finally:
        console.stop()
    print(f"the console accepts: {names}")
    assert not problems, "\n".join(problems)
    assert names["TLS_1_2_CIPHER_SUITES"] and names["TLS_1_3_CIPHER_SUITES"], names
