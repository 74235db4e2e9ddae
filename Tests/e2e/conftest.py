"""Fixtures for the end-to-end tests: a throwaway CA and server certificate, the sample backend
(deploy/backend/app.py) and the real ils-gateway binary, each as a child process on a free port.

Every process started here is stopped at the end (SIGTERM, then SIGKILL), every network operation has a timeout,
and a per-test alarm turns any hang that slips through into a failure rather than a stuck CI job.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

# Assertions in the shared helper module get pytest's detailed failure messages, as if written in a test module.
# (Must run before anything imports it: conftest is loaded before the test modules are.)
pytest.register_assert_rewrite("sse_helpers")

REPO_ROOT = Path(__file__).resolve().parents[2]
BACKEND_APP = REPO_ROOT / "deploy" / "backend" / "app.py"
MODES = ("tls", "plain")

# Generous, because CI machines are slow; a healthy run never comes close.
STARTUP_TIMEOUT_S = 20.0
STOP_TIMEOUT_S = 5.0
TEST_HANG_LIMIT_S = 90


_handed_out: set[int] = set()


def free_port() -> int:
    """A port that is free now, for a child to listen on.

    Taken below the kernel's ephemeral range (net.ipv4.ip_local_port_range), never twice in a run: a port the
    kernel handed out with `bind(0)` comes from that range, so the source port of any connection a test opens in the
    meantime (a gateway dialing its backend, a tunnel its controller) could take it before the child binds it."""
    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    lowest = 10000 if low > 12000 else 1024
    for _ in range(200):
        port = random.randrange(lowest, low)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def port_accepts(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------------------------
# Child processes
# ------------------------------------------------------------------------------------------------------------------

_running: list["ManagedProcess"] = []


class ManagedProcess:
    """A child process whose stderr/stdout go to a file (a pipe nobody reads would eventually block it)."""

    def __init__(
        self,
        name: str,
        args: list[str],
        log_dir: Path,
        cwd: Optional[Path] = None,
        env: Optional[dict[str, str]] = None,
    ) -> None:
        self.name = name
        self.args = args
        self.log_path = log_dir / f"{name}-{time.time_ns()}.log"
        self.cwd = cwd or REPO_ROOT
        self.env = env  # None: inherit this process's environment
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
            env=self.env,
        )
        _running.append(self)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def logs(self, tail: int = 8000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-tail:].decode("utf-8", "replace")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> Optional[int]:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=timeout)
        self._log.close()
        if self in _running:
            _running.remove(self)
        return self.proc.returncode

    def full_log(self) -> str:
        """Everything the process has written so far (logs() returns only a tail)."""
        try:
            return self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""

    def wait_for_log(self, text: str, timeout: float = STARTUP_TIMEOUT_S) -> float:
        """Polls the log until it contains `text`; returns the seconds waited. Fails if the process exits first."""
        started = time.monotonic()
        self.wait_for_log_count(text, timeout=timeout)
        return time.monotonic() - started

    def wait_for_log_count(
        self, text: str, count: int = 1, after: int = 0, timeout: float = STARTUP_TIMEOUT_S
    ) -> str:
        """Polls the log past its first `after` characters until `text` occurs at least `count` times; returns that
        part of the log. Fails if the process exits first or `timeout` passes.

        The binary writes its log lines from a thread of their own, a little after the event that caused them: a test
        waits for a line with this before asserting on its content or on how many there are."""
        deadline = time.monotonic() + timeout
        while True:
            exited = not self.alive()  # before reading: a line written just before the exit is still seen
            log = self.full_log()[after:]
            if log.count(text) >= count:
                return log
            if exited:
                pytest.fail(
                    f"{self.name} exited with code {self.proc.returncode} before logging "
                    f"{text!r} {count} time(s).\ncommand: {' '.join(self.args)}\noutput:\n{self.logs()}",
                    pytrace=False,
                )
            if time.monotonic() >= deadline:
                pytest.fail(
                    f"{self.name} did not log {text!r} {count} time(s) within {timeout:.0f} s (seen {log.count(text)})."
                    f"\ncommand: {' '.join(self.args)}\noutput:\n{self.logs()}",
                    pytrace=False,
                )
            time.sleep(0.05)

    def wait_for_port(self, port: int, timeout: float = STARTUP_TIMEOUT_S, host: str = "127.0.0.1") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                pytest.fail(
                    f"{self.name} exited with code {self.proc.returncode} before listening on {port}.\n"
                    f"command: {' '.join(self.args)}\noutput:\n{self.logs()}",
                    pytrace=False,
                )
            if port_accepts(port, host):
                return
            time.sleep(0.05)
        self.stop()
        pytest.fail(
            f"{self.name} did not accept connections on 127.0.0.1:{port} within {timeout:.0f} s.\n"
            f"command: {' '.join(self.args)}\noutput:\n{self.logs()}",
            pytrace=False,
        )


class Backend(ManagedProcess):
    def __init__(self, log_dir: Path, port: Optional[int] = None, host: str = "127.0.0.1") -> None:
        """`host`: 127.0.0.1, or an address of an interface the test made (a gateway in a namespace reaches it)."""
        self.port = port or free_port()
        self.host = host
        super().__init__(
            "backend",
            [sys.executable, str(BACKEND_APP), "--host", host, "--port", str(self.port), "--log-level", "info"],
            log_dir,
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        super().start()
        self.wait_for_port(self.port, host=self.host)
        # Listening is not quite ready: wait until the app itself answers.
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=1, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        pytest.fail(f"backend on port {self.port} never answered /health.\n{self.logs()}", pytrace=False)

    def client(self) -> httpx.Client:
        """A client that talks to the backend directly, bypassing the gateway."""
        return httpx.Client(base_url=self.url, trust_env=False, timeout=httpx.Timeout(10.0, connect=5.0))


class Gateway(ManagedProcess):
    def __init__(self, binary: Path, mode: str, backend: Backend, certs: "Certs", log_dir: Path, extra: list[str]):
        assert mode in MODES
        self.mode = mode
        self.port = free_port()
        self.backend = backend
        self.certs = certs
        args = [
            str(binary), "serve", "--mode", "http",
            "--listen", f"127.0.0.1:{self.port}",
            "--backend", backend.url,
            "--log-level", "info",
        ]
        if mode == "tls":
            args += ["--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key)]
        else:
            args += ["--plain-http"]
        super().__init__(f"gateway-{mode}", args + extra, log_dir)

    def start(self) -> None:
        super().start()
        self.wait_for_port(self.port)

    @property
    def scheme(self) -> str:
        return "https" if self.mode == "tls" else "http"

    @property
    def authority(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://{self.authority}"

    def ws_url(self, path: str) -> str:
        return f"{'wss' if self.mode == 'tls' else 'ws'}://{self.authority}{path}"

    def ssl_context(self) -> Optional[ssl.SSLContext]:
        return self.certs.client_context() if self.mode == "tls" else None

    def client(self, timeout: float = 30.0) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            verify=self.ssl_context() or True,
            trust_env=False,  # an HTTP(S)_PROXY in the environment must not reroute test traffic
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def curl_args(self) -> list[str]:
        args = ["curl", "--silent", "--show-error", "--noproxy", "*", "--max-time", "30"]
        if self.mode == "tls":
            args += ["--cacert", str(self.certs.ca_cert)]
        return args


# ------------------------------------------------------------------------------------------------------------------
# Certificates
# ------------------------------------------------------------------------------------------------------------------


class Certs:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca_key = directory / "ca.key"
        self.ca_cert = directory / "ca.pem"
        self.server_key = directory / "server.key"
        self.server_cert = directory / "server.pem"

    def client_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_cert))


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.fail(f"openssl {' '.join(args)} failed:\n{result.stderr}", pytrace=False)


def make_certs(directory: Path) -> Certs:
    """A CA and a server certificate for 127.0.0.1 and localhost, EC P-256.

    The extensions are the ones strict verifiers insist on (basicConstraints, keyUsage, extendedKeyUsage, SAN,
    subject/authority key identifiers), so curl, Python's ssl and the gateway's TLS stack all accept them.
    """
    c = Certs(directory)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", c.ca_key.name, cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", c.ca_key.name, "-sha256", "-days", "7",
        "-subj", "/CN=ils-gateway e2e test CA",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
        "-out", c.ca_cert.name,
        cwd=directory,
    )
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", c.server_key.name,
             cwd=directory)
    _openssl("req", "-new", "-key", c.server_key.name, "-subj", "/CN=localhost", "-out", "server.csr", cwd=directory)
    (directory / "server.ext").write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl(
        "x509", "-req", "-in", "server.csr", "-CA", c.ca_cert.name, "-CAkey", c.ca_key.name,
        "-CAcreateserial", "-days", "7", "-sha256", "-extfile", "server.ext", "-out", c.server_cert.name,
        cwd=directory,
    )
    return c


# ------------------------------------------------------------------------------------------------------------------
# Controller (enrollment and admin CLI)
# ------------------------------------------------------------------------------------------------------------------

CLI_TIMEOUT_S = 30.0

# Variables that must not leak into the binary: a stray ILS_STATE_DIR or proxy setting would change what it does.
_CLI_ENV_DROP = ("ILS_STATE_DIR", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _CLI_ENV_DROP}


@dataclass
class CLIResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    elapsed: float  # wall time in seconds, process start to exit

    def describe(self) -> str:
        return (
            f"command: {' '.join(self.args)}\nexit: {self.returncode} ({self.elapsed:.3f} s)\n"
            f"stdout: {self.stdout!r}\nstderr: {self.stderr!r}"
        )


def run_cli(binary: Path, args: list[str], cwd: Path, timeout: float = CLI_TIMEOUT_S) -> CLIResult:
    """Runs the binary to completion (with a timeout) and captures its output; never raises on a non-zero exit."""
    argv = [str(binary), *args]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv, cwd=cwd, env=cli_env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(
            f"`{' '.join(argv)}` did not finish within {timeout:.0f} s.\n"
            f"stdout: {e.stdout!r}\nstderr: {e.stderr!r}",
            pytrace=False,
        )
    return CLIResult(argv, proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


class Controller:
    """A controller made with `controller init` in a directory of its own, run with `controller run`.

    `root` is the working directory of every CLI command (so identities/ lands there); the state directory is
    root/state. The binary is a copy taken when the fixture starts, so a rebuild during the run cannot mix versions.
    """

    def __init__(self, binary: Path, root: Path, log_dir: Path) -> None:
        self.binary = binary
        self.root = root
        self.log_dir = log_dir
        self.state_dir = root / "state"
        self.port = free_port()
        self.metrics_port = free_port()
        self.address = f"https://127.0.0.1:{self.port}"
        self.process: Optional[ManagedProcess] = None
        self.init_result: Optional[CLIResult] = None

    def cli(self, *args: str, timeout: float = CLI_TIMEOUT_S) -> CLIResult:
        return run_cli(self.binary, list(args), self.root, timeout)

    def popen(self, *args: str) -> subprocess.Popen:
        """For tests that need processes running at the same time; the caller waits with a timeout."""
        return subprocess.Popen(
            [str(self.binary), *args], cwd=self.root, env=cli_env(), stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    def init(self, *extra: str) -> CLIResult:
        return self.cli("controller", "init", "--state-dir", str(self.state_dir), "--address", self.address, *extra)

    def start(self) -> None:
        assert self.process is None or not self.process.alive(), "controller already running"
        self.process = ManagedProcess(
            "controller",
            [str(self.binary), "controller", "run", "--state-dir", str(self.state_dir),
             "--listen", f"127.0.0.1:{self.port}", "--log-level", "info",
             "--metrics", f"127.0.0.1:{self.metrics_port}"],
            self.log_dir,
            cwd=self.root,
            env=cli_env(),
        )
        self.process.start()
        self.process.wait_for_port(self.port)
        # The metrics listener starts beside the controller's port, a moment after it.
        self.process.wait_for_port(self.metrics_port)

    def stop(self) -> Optional[int]:
        if self.process is None:
            return None
        return self.process.stop()

    def restart(self) -> None:
        self.stop()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while port_accepts(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.start()

    def logs(self) -> str:
        return self.process.logs() if self.process else ""

    def refusals(self, reason: str) -> float:
        """The refusals the controller counted for `reason` (`ils_refusals_total{reason=...}`): its log says a refused
        overlay connection once a minute per reason, so a rate of refusals is read here."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            text = r.read().decode()
        return sum(float(line.rpartition(" ")[2]) for line in text.splitlines()
                   if line.startswith("ils_refusals_total") and f'reason="{reason}"' in line)


# ------------------------------------------------------------------------------------------------------------------
# Fixtures
# ------------------------------------------------------------------------------------------------------------------


def _executable(raw: str, variable: str) -> Path:
    """A built binary at `raw` (relative to the repository), or a test failure that says how to get it."""
    path = Path(raw)
    if not path.is_absolute():
        path = REPO_ROOT / path
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"{path.name} not found or not executable at {path}. Build it first "
            f"(`swift build` in {REPO_ROOT}) or point {variable} at it.",
            pytrace=False,
        )
    return path


@pytest.fixture(scope="session")
def ils_bin() -> Path:
    return _executable(os.environ.get("ILS_BIN", ".build/debug/ils-gateway"), "ILS_BIN")


@pytest.fixture(scope="session")
def client_example_bin(ils_bin: Path) -> Path:
    """ils-client-example, built by the same `swift build` next to ils-gateway (or ILS_CLIENT_EXAMPLE_BIN)."""
    raw = os.environ.get("ILS_CLIENT_EXAMPLE_BIN") or str(ils_bin.parent / "ils-client-example")
    return _executable(raw, "ILS_CLIENT_EXAMPLE_BIN")


@pytest.fixture(scope="session")
def work_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ils-e2e-") as d:
        yield Path(d)


@pytest.fixture(scope="session")
def certs(work_dir: Path) -> Certs:
    d = work_dir / "pki"
    d.mkdir()
    return make_certs(d)


@pytest.fixture(scope="session")
def backend(work_dir: Path) -> Iterator[Backend]:
    b = Backend(work_dir)
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="session", params=MODES)
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def gateway(ils_bin: Path, mode: str, backend: Backend, certs: Certs, work_dir: Path) -> Iterator[Gateway]:
    """One shared gateway per mode, in front of the shared backend."""
    g = Gateway(ils_bin, mode, backend, certs, work_dir, [])
    g.start()
    yield g
    g.stop()


@pytest.fixture(scope="module")
def controller(ils_bin: Path) -> Iterator[Controller]:
    """One controller per test module, in a temporary directory of its own: `controller init`, then `controller run`
    on 127.0.0.1 and a free port. CLI commands go through `controller.cli(...)`, with that directory as cwd."""
    # The binary copy and the logs live apart from the working directory, so tests can check that a refused
    # command wrote nothing there.
    with tempfile.TemporaryDirectory(prefix="ils-ctl-harness-") as harness, \
            tempfile.TemporaryDirectory(prefix="ils-ctl-") as root:
        harness_dir = Path(harness)
        binary = harness_dir / "ils-gateway"
        shutil.copy2(ils_bin, binary)
        c = Controller(binary, Path(root), harness_dir)
        c.init_result = c.init()
        if c.init_result.returncode != 0:
            pytest.fail(f"controller init failed.\n{c.init_result.describe()}", pytrace=False)
        c.start()
        try:
            yield c
        finally:
            c.stop()


@pytest.fixture
def backend_factory(work_dir: Path) -> Iterator[Callable[..., Backend]]:
    """Backends of a test's own, for tests that stop and restart them."""
    started: list[Backend] = []

    def make(port: Optional[int] = None) -> Backend:
        b = Backend(work_dir, port)
        b.start()
        started.append(b)
        return b

    yield make
    for b in started:
        b.stop()


@pytest.fixture
def gateway_factory(ils_bin: Path, mode: str, certs: Certs, work_dir: Path) -> Iterator[Callable[..., Gateway]]:
    """Gateways of a test's own, for unusual flags or tests that stop the gateway."""
    started: list[Gateway] = []

    def make(backend: Backend, *extra: str) -> Gateway:
        g = Gateway(ils_bin, mode, backend, certs, work_dir, list(extra))
        g.start()
        started.append(g)
        return g

    yield make
    for g in started:
        g.stop()


@pytest.fixture(autouse=True)
def _hang_guard(request: pytest.FixtureRequest) -> Iterator[None]:
    """Turns a hung test into a failure. Every operation has its own timeout; this is the backstop. A test whose
    claim is itself a length of time (`@pytest.mark.hang_limit(SECONDS)`) gets that much more."""
    marker = request.node.get_closest_marker("hang_limit")
    limit = TEST_HANG_LIMIT_S + (int(marker.args[0]) if marker else 0)

    def on_alarm(signum, frame):
        raise TimeoutError(f"test still running after {limit} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(limit)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On failure, attach the output of every process still running, which is usually where the cause is."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for p in list(_running):
            report.sections.append((f"{p.name} (pid {p.pid}) output, tail", p.logs(4000)))


def pytest_sessionfinish(session, exitstatus):
    # Fixture teardown normally does this; this catches processes left behind by an interrupted run.
    for p in list(_running):
        try:
            p.stop(timeout=2)
        except Exception:
            pass
