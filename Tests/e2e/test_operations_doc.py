"""docs/operations.md, run as written on 127.0.0.1: a practice controller with a config file, a backup taken while
it runs, a restore after the state is lost, a TLS certificate rotation, a move to a new name, metrics, the
troubleshooting commands and a config typo refused by name. Blocks that need root, systemd or Docker are `setup`
blocks and are not run here (deploy/systemd/verify.sh and test_deploy_files.py check those files)."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from doc_runner import BlockResult, DocSession, extract, walk

pytestmark = pytest.mark.e2e

PAGE = REPO_ROOT / "docs" / "operations.md"


def output_of(results: list, needle: str, nth: int = 0) -> BlockResult:
    found = [r for b, r in results if needle in b.code and isinstance(r, BlockResult)]
    assert len(found) > nth, f"no run block containing {needle!r}"
    return found[nth]


def test_operations_page(ils_bin: Path) -> None:
    blocks = extract(PAGE)
    with tempfile.TemporaryDirectory(prefix="ils-ops-") as home, \
            tempfile.TemporaryDirectory(prefix="ils-ops-logs-") as logs:
        session = DocSession(PAGE, ils_bin, Path(home), doc_ports=(7443, 9464))
        try:
            results = walk(session, blocks, Path(logs))
            work = Path(home) / "ils-ops"

            scanned = output_of(results, "zbarimg --raw -q ipad-token.png\n").output
            assert re.search(r"^ils-enroll://v1/[\w-]+\.[\w-]+\.[\w-]+$", scanned, re.M), scanned
            assert not (work / "ipad-token.png").exists(), "the QR image outlived the enrollment"
            assert "ipad" in output_of(results, 'enroll "$(zbarimg').output

            shown = output_of(results, "admin service show second-api").output
            assert "dial:      anyOf(#ipad, @laptop)" in shown and "may dial:  ipad,laptop" in shown, shown
            assert "gateways:  none (the service is down)" in shown, shown
            audit = output_of(results, "admin audit --since 1h").output
            for action in ("service.create", "service.update", "identity.attributes"):
                assert action in audit, audit

            archive = output_of(results, "tar -tzf").output
            for name in ("store.sqlite", "ca.key", "token.key", "controller.json"):
                assert name in archive, archive
            assert oct((work / "ils-controller-backup.tar.gz").stat().st_mode & 0o777) == "0o600"

            restored = output_of(results, "ils-gateway admin identity list").output
            assert re.search(r"laptop\s", restored), f"the restored store lost the laptop:\n{restored}"

            rotated = output_of(results, "controller rotate-tls --state-dir ctl\n").output
            assert "new TLS certificate" in rotated and "notAfter" in rotated
            assert (work / "ctl" / "server.pem.old").is_file()

            moved = output_of(results, "grep '\"controller\"'").output
            assert f"https://localhost:{session.port(7443)}" in moved, moved

            metrics = output_of(results, "/metrics").output
            assert "ils_enrollments_total" in metrics, metrics

            typo = output_of(results, "typo.yaml")
            assert typo.returncode == 93
            assert "typo.yaml line 2: unknown key 'listen-adress' for controller run" in typo.output

            assert (Path(home) / ".local/share/bash-completion/completions/ils-gateway").stat().st_size > 1000
            for identity in (work / "identities").glob("*.json"):
                assert identity.stat().st_mode & 0o077 == 0, f"{identity} is readable by others"
        finally:
            session.stop_all()
