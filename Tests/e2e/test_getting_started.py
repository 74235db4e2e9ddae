"""docs/getting-started.md, followed as a new user would: every shell block on the page, in order, on 127.0.0.1.

The page's own commands set up a controller, the sample backend, a dark gateway and two device tunnels, stream an
answer, and revoke the iPad. On top of each block's own exit status this test checks what the page promises in
prose: the streamed answer arrived as Server-Sent Events, the gateway owns no listening socket, the iPad's long
stream stopped at revocation while the laptop kept working.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from doc_runner import DocSession, extract, walk

pytestmark = pytest.mark.e2e

PAGE = REPO_ROOT / "docs" / "getting-started.md"
REVOCATION_BOUND_S = 5.0


def listening_pids() -> set[int]:
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, timeout=10).stdout
    return {int(p) for p in re.findall(r"pid=(\d+)", out)}


def test_getting_started_walkthrough(ils_bin: Path) -> None:
    blocks = extract(PAGE)
    assert any(b.kind == "fails" for b in blocks) and any(b.kind == "background" for b in blocks)
    setup = [b for b in blocks if b.kind == "setup"]
    assert len(setup) == 1 and "swift build -c release --product ils-gateway" in setup[0].code

    with tempfile.TemporaryDirectory(prefix="ils-doc-") as home, \
            tempfile.TemporaryDirectory(prefix="ils-doc-logs-") as logs:
        session = DocSession(PAGE, ils_bin, Path(home), doc_ports=(7443, 8000, 8080, 8081))
        try:
            results = walk(session, blocks, Path(logs))
            stream = next(r for b, r in results if "n=5&interval_ms=200" in b.code)
            events = [ln for ln in stream.output.splitlines() if ln.startswith("data:")]
            assert len(events) >= 5, f"the streamed answer did not come through as SSE:\n{stream.output}"

            gateway = next(r for b, r in results if b.code.strip().startswith("ils-gateway serve"))
            tunnel = next(r for b, r in results if "--listen 127.0.0.1:8080" in b.code)
            if shutil.which("ss"):
                pids = listening_pids()
                assert tunnel.pid in pids, "ss does not show the tunnel's listener; the check cannot be trusted"
                assert gateway.pid not in pids, "the gateway owns a listening socket"

            long_stream = next(r for b, r in results if "ipad-stream.txt" in b.code and b.kind == "background")
            deadline = time.monotonic() + REVOCATION_BOUND_S
            while long_stream.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not long_stream.alive(), "the iPad's live stream was still open after its revocation"
            received = (Path(home) / "ils-demo" / "ipad-stream.txt").read_text()
            assert received.count("data:") >= 3, f"the long stream never started:\n{received[:500]}"
            assert received.count("data:") < 600, "the long stream ran to its end: revocation did not cut it"

            listed = [r for b, r in results if b.code.strip().endswith("ils-gateway admin identity list")][-1]
            assert re.search(r"ipad\s.*revoked", listed.output), listed.output
            assert re.search(r"laptop\s.*active", listed.output), listed.output
        finally:
            session.stop_all()
