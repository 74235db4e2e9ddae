"""docs/http-mode.md, run as written on 127.0.0.1: a private CA and server certificate made with the page's openssl
commands, HTTP mode from a config file streaming SSE to a client that trusts the CA, a client that does not refused
by TLS, cleartext refused unless asked for, cleartext on loopback configured from the environment, and client
certificates of enrolled devices (a controller of the page's own; the revoked laptop refused)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from doc_runner import BlockResult, DocSession, extract, walk

pytestmark = pytest.mark.e2e

PAGE = REPO_ROOT / "docs" / "http-mode.md"


def test_http_mode_page(ils_bin: Path) -> None:
    blocks = extract(PAGE)
    with tempfile.TemporaryDirectory(prefix="ils-http-") as home, \
            tempfile.TemporaryDirectory(prefix="ils-http-logs-") as logs:
        session = DocSession(PAGE, ils_bin, Path(home), doc_ports=(8000, 8443, 8081, 7443, 8444))
        try:
            results = walk(session, blocks, Path(logs))
            runs = [(b, r) for b, r in results if isinstance(r, BlockResult)]
            tls_stream = next(r for b, r in runs if "--cacert ca.pem" in b.code)
            assert tls_stream.output.count("data:") >= 3, tls_stream.output
            plain_stream = next(r for b, r in runs if "http://127.0.0.1:8081/claude/stream" in b.code)
            assert plain_stream.output.count("data:") >= 3, plain_stream.output
            refused = next(r for b, r in runs if b.kind == "fails" and "serve --mode http" in b.code)
            assert refused.returncode == 64 and "--plain-http" in refused.output, refused.output
            untrusted = next(r for b, r in runs if b.kind == "fails" and "curl" in b.code)
            assert untrusted.returncode == 60, untrusted.output  # curl: peer certificate cannot be authenticated
            # Client certificates: the laptop's identity reaches the backend; no certificate, or a revoked device's,
            # is refused (curl 56: TLS alert on the first read; 22: the gateway's 403).
            admitted = next(r for b, r in runs if "8444/debug/headers" in b.code)
            assert '"x-ils-identity":["laptop"]' in admitted.output.replace(" ", ""), admitted.output
            no_cert, revoked = [r for b, r in runs if b.kind == "fails" and "8444" in b.code]
            assert no_cert.returncode == 56, no_cert.output
            assert revoked.returncode == 22 and "403" in revoked.output, revoked.output
            key = Path(home) / "ils-http" / "server.key"
            assert key.stat().st_mode & 0o077 == 0, "the page left the server key readable by others"
        finally:
            session.stop_all()
