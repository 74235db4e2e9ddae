"""The audit log and the CLI's text output against the real binary (issue 23, items 6 and 7, and `enroll --pem`).

- An unauthenticated flood of garbage enrollments writes a bounded number of audit rows (counted in the SQLite file),
  and reading the log shows every refusal counted.
- The log pages (`admin audit --limit/--before`) and retention prunes it (`controller run --audit-max-rows`,
  `--audit-retention`).
- A hostile audit row (ESC, CSI, CR, BEL) prints escaped in text and exact in `--json`.
- `enroll --pem` writes PEM files curl can use against a TLS server that checks client certificates.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from conftest import Controller, ManagedProcess, cli_env, free_port

pytestmark = pytest.mark.e2e

FLOOD = 3000
HOSTILE = "gw\x1b[2J\x1b[1;1H2026-01-01  admin  identity.enable  ipad\r\x07\x9b31m"


def store_rows(store: Path, where: str = "1") -> int:
    db = sqlite3.connect(f"file:{store}?mode=ro", uri=True, timeout=10)
    try:
        return db.execute(f"SELECT COUNT(*) FROM audit WHERE {where}").fetchone()[0]
    finally:
        db.close()


def store_bytes(state: Path) -> int:
    return sum(p.stat().st_size for p in state.glob("store.sqlite*"))


def insert_rows(store: Path, rows: list[tuple[int, str, str, str, str]]) -> None:
    """Writes audit rows straight into the SQLite file, as something that bypassed the controller's checks would."""
    db = sqlite3.connect(str(store), timeout=10)
    try:
        db.executemany("INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)", rows)
        db.commit()
    finally:
        db.close()


def test_a_flood_of_garbage_enrollments_writes_a_bounded_number_of_rows(controller: Controller) -> None:
    """3,000 garbage POST /v1/enroll over a few keep-alive connections, no credentials: before the fix, 3,000 rows
    and ~3 MB of store files. Now one row for the source and code, and one count row once the log is read."""
    store = controller.state_dir / "store.sqlite"
    rows_before = store_rows(store, "action = 'enroll.refused'")
    bytes_before = store_bytes(controller.state_dir)
    body = {"token": "a.b.c", "publicKey": "x", "proof": "y"}
    started = time.monotonic()
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=controller.address, verify=str(controller.state_dir / "ca.pem"), timeout=10.0) as c:
        for _ in range(FLOOD):
            status = c.post("/v1/enroll", json=body).status_code
            statuses[status] = statuses.get(status, 0) + 1
    took = time.monotonic() - started
    assert statuses == {400: FLOOD}, statuses

    # Refusal rows are written by a background queue; reading the log flushes it (and writes the count row), so
    # the rows and the store's size are measured after that, when everything the flood caused is on disk.
    r = controller.cli("admin", "audit", "--since", "15m", "--limit", "1000", "--json")
    assert r.returncode == 0, r.describe()
    written = store_rows(store, "action = 'enroll.refused'") - rows_before
    grown = store_bytes(controller.state_dir) - bytes_before
    print(f"{FLOOD} garbage enrollments in {took:.1f} s ({statuses}): {written} audit rows, store files +{grown} bytes")
    assert written <= 3, f"{written} audit rows for {FLOOD} refusals from one source"
    assert grown < 256 * 1024, f"store files grew by {grown} bytes"
    refused = [e for e in json.loads(r.stdout) if e["action"] == "enroll.refused" and e["actor"] == "127.0.0.1"]
    counted = sum(int(e["detail"].split("count=")[1]) if "count=" in e["detail"] else 1 for e in refused)
    assert counted == FLOOD, refused


def test_a_hostile_audit_row_prints_escaped_in_text_and_exact_in_json(controller: Controller) -> None:
    """ESC/CSI/CR/BEL in a row (written into the SQLite file directly: the controller itself now stores them
    escaped) never reach the terminal raw; JSON output keeps the exact string, validly escaped."""
    insert_rows(controller.state_dir / "store.sqlite",
                [(int(time.time()), HOSTILE, "bind.refused", HOSTILE, "detail " + HOSTILE)])
    r = controller.cli("admin", "audit", "--since", "15m")
    assert r.returncode == 0, r.describe()
    for raw in ("\x1b", "\r", "\x07", "\x9b"):
        assert raw not in r.stdout, f"{raw!r} printed raw: {r.stdout!r}"
    line = next(line for line in r.stdout.splitlines() if "bind.refused" in line)
    assert r"gw\x1b[2J\x1b[1;1H2026-01-01  admin  identity.enable  ipad\r\x07\x9b31m" in line, line
    assert len([ln for ln in r.stdout.splitlines() if "identity.enable" in ln]) == 1, "a forged line appeared"

    r = controller.cli("admin", "audit", "--since", "15m", "--json")
    assert r.returncode == 0, r.describe()
    for raw in ("\x1b", "\r", "\x07", "\x9b"):  # escaped the JSON way (C1 too: U+009B is an 8-bit CSI)
        assert raw not in r.stdout, f"{raw!r} in the JSON output"
    entry = next(e for e in json.loads(r.stdout) if e["action"] == "bind.refused")
    assert entry["actor"] == HOSTILE and entry["target"] == HOSTILE and entry["detail"] == "detail " + HOSTILE


def test_admin_audit_pages_with_limit_and_before(controller: Controller) -> None:
    """`--limit` shows the newest entries, stderr names the command for the next page, and following it walks the
    whole log once, oldest page last, with nothing twice."""
    now = int(time.time())
    insert_rows(controller.state_dir / "store.sqlite",
                [(now, "pager", "test.page", str(i), "") for i in range(250)])
    total = store_rows(controller.state_dir / "store.sqlite")
    seen: list[int] = []
    args = ["admin", "audit", "--limit", "100", "--json"]
    pages = 0
    while True:
        r = controller.cli(*args)
        assert r.returncode == 0, r.describe()
        page = json.loads(r.stdout)
        pages += 1
        assert 0 < len(page) <= 100
        seqs = [e["seq"] for e in page]
        assert seqs == sorted(seqs)
        seen = seqs + seen
        if "--before" not in r.stderr:
            break
        before = r.stderr.split("--before ")[1].split()[0]
        assert int(before) == seqs[0]
        args = ["admin", "audit", "--limit", "100", "--json", "--before", before]
    assert len(seen) == len(set(seen)) == total, (len(seen), total)
    assert pages == -(-total // 100)

    r = controller.cli("admin", "audit", "--limit", "3")
    assert r.returncode == 0, r.describe()
    assert len(r.stdout.splitlines()) == 3 and r.stdout.splitlines()[-1].split()[-1] == "249"
    assert "ils-gateway admin audit --limit 3 --before" in r.stderr
    r = controller.cli("admin", "audit", "--limit", "0")
    assert r.returncode == 64, r.describe()


def test_retention_prunes_by_age_and_row_count(ils_bin: Path, tmp_path: Path) -> None:
    """A controller started with --audit-retention 30d --audit-max-rows 1000 on a log of 3,000 entries 100 days old
    and 1,500 recent ones keeps the newest 1,000 recent ones, without a request."""
    c = Controller(ils_bin, tmp_path / "root", tmp_path)
    c.root.mkdir()
    assert c.init().returncode == 0
    store = c.state_dir / "store.sqlite"
    now = int(time.time())
    insert_rows(store, [(now - 100 * 86400, "old", "test.old", str(i), "") for i in range(3000)]
                + [(now, "new", "test.new", str(i), "") for i in range(1500)])
    process = ManagedProcess(
        "controller-retention",
        [str(ils_bin), "controller", "run", "--state-dir", str(c.state_dir), "--listen", f"127.0.0.1:{c.port}",
         "--audit-retention", "30d", "--audit-max-rows", "1000"],
        tmp_path, cwd=c.root, env=cli_env(),
    )
    process.start()
    try:
        deadline = time.monotonic() + 20
        while store_rows(store) > 1000 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert store_rows(store) == 1000, process.logs()
        assert store_rows(store, "action = 'test.old'") == 0
        assert store_rows(store, "action = 'test.new' AND CAST(target AS INTEGER) >= 500") == 1000
        # The line comes after the last batch's commit, so the rows can be down to 1000 before it is written.
        process.wait_for_log("audit log pruned")
    finally:
        process.stop()
    r = subprocess.run([str(ils_bin), "controller", "run", "--state-dir", str(c.state_dir), "--audit-max-rows", "5"],
                       capture_output=True, text=True, timeout=20, env=cli_env())
    assert r.returncode == 64 and "--audit-max-rows" in r.stderr, r.stderr


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_enroll_pem_writes_files_curl_uses_against_a_server_that_checks_client_certificates(
        controller: Controller, tmp_path: Path) -> None:
    r = controller.cli("admin", "identity", "create", "pem-dev", "--role", "device", "-o", "pem-dev.jwt")
    assert r.returncode == 0, r.describe()
    r = controller.cli("enroll", "pem-dev.jwt", "--pem")
    assert r.returncode == 0, r.describe()
    ids = controller.root / "identities"
    cert, key, ca = ids / "pem-dev.cert.pem", ids / "pem-dev.key.pem", ids / "pem-dev.ca.pem"
    for p in (ids / "pem-dev.json", cert, key, ca):
        assert p.is_file() and mode(p) == 0o600, f"{p}: {oct(mode(p)) if p.exists() else 'missing'}"
    assert not [p.name for p in ids.iterdir() if p.name.endswith(".tmp")]
    identity = json.loads((ids / "pem-dev.json").read_text())
    assert cert.read_text().strip() == identity["certificate"].strip()
    assert key.read_text().strip() == identity["privateKey"].strip()
    assert ca.read_text().strip() == (controller.state_dir / "ca.pem").read_text().strip()
    pub_cert = subprocess.run(["openssl", "x509", "-in", str(cert), "-noout", "-pubkey"], capture_output=True,
                              text=True, timeout=20).stdout
    pub_key = subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout"], capture_output=True, text=True,
                             timeout=20).stdout
    assert pub_cert and pub_cert == pub_key, "the key file is not the certificate's key"

    # The controller's API verifies client certificates against its CA and says whom it saw.
    curl = ["curl", "-sS", "--max-time", "10", "--cacert", str(ca), "--cert", str(cert), "--key", str(key)]
    r = subprocess.run(curl + [f"{controller.address}/v1/whoami"], capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["name"] == "pem-dev", r.stdout

    # A TLS server that requires a client certificate from the CA (openssl s_server -Verify): refused without the
    # files, served with them.
    port = free_port()
    server = subprocess.Popen(
        ["openssl", "s_server", "-accept", str(port), "-cert", str(controller.state_dir / "server.pem"),
         "-key", str(controller.state_dir / "server.key"), "-CAfile", str(ca), "-Verify", "1",
         "-verify_return_error", "-www"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with __import__("socket").create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.1)
        url = f"https://127.0.0.1:{port}/"
        bare = subprocess.run(["curl", "-sS", "--max-time", "10", "--cacert", str(ca), url], capture_output=True,
                              text=True, timeout=20)
        assert bare.returncode != 0, "s_server served a client without a certificate"
        good = subprocess.run(curl + [url], capture_output=True, text=True, timeout=20)
        assert good.returncode == 0 and "Ciphers supported" in good.stdout, (good.stderr, good.stdout[:300])
    finally:
        server.kill()
        server.wait(timeout=10)

    # Without --force, existing PEM files stop a second enrollment before its token is spent.
    r = controller.cli("admin", "identity", "reissue", "pem-dev", "-o", "pem-dev-2.jwt")
    assert r.returncode == 0, r.describe()
    (ids / "pem-dev.json").rename(ids / "pem-dev.old.json")
    r = controller.cli("enroll", "pem-dev-2.jwt", "--pem")
    assert r.returncode == 79 and "pem-dev.cert.pem" in r.stderr, r.describe()
    r = controller.cli("enroll", "pem-dev-2.jwt", "--pem", "--force")
    assert r.returncode == 0, r.describe()


def test_a_gateway_that_sends_escapes_in_its_service_name_cannot_forge_audit_lines(controller: Controller) -> None:
    """The real path: an enrolled gateway identity runs `serve` with ESC/CSI/BEL in its service name. The refusal
    is audited, and `admin audit` shows the name with its escapes visible, on one line."""
    r = controller.cli("admin", "identity", "create", "gw-esc", "--role", "gateway", "-o", "gw-esc.jwt")
    assert r.returncode == 0, r.describe()
    assert controller.cli("enroll", "gw-esc.jwt").returncode == 0
    hostile = "svc\x1b[2J\x1b[1;1Hadmin  identity.enable  ipad\x07"
    gateway = ManagedProcess(
        "gateway-escapes",
        [str(controller.binary), "serve", "--mode", "ziti", "--identity", "identities/gw-esc.json",
         "--service", hostile, "--backend", "http://127.0.0.1:9", "--log-level", "info"],
        controller.log_dir, cwd=controller.root, env=cli_env(),
    )
    store = controller.state_dir / "store.sqlite"
    gateway.start()
    try:
        deadline = time.monotonic() + 15
        while store_rows(store, "action = 'bind.refused' AND actor = 'gw-esc'") == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        gateway.stop()
    assert store_rows(store, "action = 'bind.refused' AND actor = 'gw-esc'") > 0, gateway.logs()
    r = controller.cli("admin", "audit", "--since", "15m")
    assert r.returncode == 0, r.describe()
    lines = [line for line in r.stdout.splitlines() if "gw-esc" in line and "bind.refused" in line]
    assert lines, r.stdout
    for raw in ("\x1b", "\x07", "\r"):
        assert raw not in r.stdout, f"{raw!r} printed raw"
    assert "1b" in lines[0] and "identity.enable" in lines[0], lines[0]
