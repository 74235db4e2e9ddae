"""A real PostgreSQL server for the end-to-end tests: the Python twin of Sources/ILSTesting/TestPostgres.swift.

Debian's PostgreSQL (the newest /usr/lib/postgresql/N/bin), `initdb` into a temporary directory, listening on a Unix
socket there and on 127.0.0.1 at a free port: password authentication (scram-sha-256) over TCP for the user `ils`,
trust on the socket, fsync off (a test server loses nothing worth keeping). PostgreSQL refuses to run as root; when
the tests do (CI does), every server command runs as the `postgres` user through runuser.

Missing PostgreSQL fails loudly (CI installs it with deploy/install-deps.sh), unless ILS_SKIP_POSTGRES=1: then the
tests that need it are skipped, with that reason.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import pytest

from conftest import free_port

PG_ROOT = Path("/usr/lib/postgresql")
USER = "ils"
# A fixed test password: the tests check it never appears in a log line.
PASSWORD = "pg-e2e-secret-4b9d"
COMMAND_TIMEOUT_S = 60.0


def binaries() -> Optional[Path]:
    """The bin directory of the newest installed PostgreSQL, or None."""
    try:
        versions = sorted(
            int(v.name) for v in PG_ROOT.iterdir() if v.name.isdigit() and (v / "bin" / "initdb").is_file()
        )
    except OSError:
        return None
    return PG_ROOT / str(versions[-1]) / "bin" if versions else None


class TestPostgres:
    """One server in a directory of its own; `stop()` (idempotent) stops it and removes the directory."""

    __test__ = False  # not a test class, whatever pytest thinks of its name

    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.as_postgres = os.geteuid() == 0
        self.directory = Path(tempfile.mkdtemp(prefix="ils-e2e-pg-"))
        self.data = self.directory / "data"
        self.log_path = self.directory / "server.log"
        self.port = free_port()
        self._databases = 0
        self._started = False
        if self.as_postgres:
            shutil.chown(self.directory, "postgres", "postgres")
        os.chmod(self.directory, 0o700)
        try:
            pwfile = self.directory / "pw"
            pwfile.write_text(PASSWORD + "\n")
            if self.as_postgres:
                shutil.chown(pwfile, "postgres", "postgres")
            self._run(
                "initdb", "-D", str(self.data), "-U", USER, f"--pwfile={pwfile}", "--auth-local=trust",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--no-sync", "--locale=C",
            )
            pwfile.unlink()
            self.start()
        except BaseException:
            # pytest.fail is an exception too: a server that never started leaves no directory behind either.
            self.stop()
            raise

    def _run(self, tool: str, *args: str) -> None:
        argv = [str(self.bin / tool), *args]
        if self.as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        # Output to a file, not a pipe: `pg_ctl start` leaves the server running with its output inherited, and a pipe
        # nobody reads past pg_ctl's exit would hold this call open.
        with tempfile.TemporaryFile() as out:
            try:
                result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                        timeout=COMMAND_TIMEOUT_S, cwd=self.directory)
            except subprocess.TimeoutExpired:
                pytest.fail(f"`{' '.join(argv)}` did not finish within {COMMAND_TIMEOUT_S:.0f} s\n{self.server_log()}",
                            pytrace=False)
            out.seek(0)
            text = out.read().decode("utf-8", "replace")
        if result.returncode != 0:
            pytest.fail(f"`{' '.join(argv)}` failed ({result.returncode}):\n{text}\n{self.server_log()}", pytrace=False)

    def server_log(self, tail: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def start(self) -> None:
        """Starts the server (after `stop_server`); returns once it accepts connections."""
        self._run(
            "pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-w", "-t", "60", "-o",
            f"-k {self.directory} -p {self.port} -h 127.0.0.1 -c fsync=off -c full_page_writes=off "
            "-c max_connections=200",
            "start",
        )
        self._started = True

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every connection is closed, then the server comes back on the same port."""
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log_path), "-m", "fast", "-w", "-t", "60", "restart")

    def create_database(self) -> str:
        """A fresh, empty database; returns its URL over TCP, without the password (give it in PGPASSWORD)."""
        self._databases += 1
        name = f"ils_e2e_{os.getpid()}_{self._databases}"
        self._run("createdb", "-h", str(self.directory), "-p", str(self.port), "-U", USER, name)
        return f"postgres://{USER}@127.0.0.1:{self.port}/{name}?sslmode=disable"

    def stop(self) -> None:
        if self._started:
            self._started = False
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            finally:
                shutil.rmtree(self.directory, ignore_errors=True)
        else:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_postgres() -> TestPostgres:
    """A started server, or a skip (ILS_SKIP_POSTGRES=1 and no PostgreSQL) or a failure saying how to install it."""
    bin_dir = binaries()
    if bin_dir is None:
        if os.environ.get("ILS_SKIP_POSTGRES") == "1":
            pytest.skip("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin) and ILS_SKIP_POSTGRES=1")
        pytest.fail(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin): run deploy/install-deps.sh "
            "(apt-get install postgresql), or set ILS_SKIP_POSTGRES=1 to skip these tests",
            pytrace=False,
        )
    return TestPostgres(bin_dir)
