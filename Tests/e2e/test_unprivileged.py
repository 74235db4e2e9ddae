"""The whole overlay run by a user without privileges, as deploy/systemd's units run it (DynamicUser=yes): controller
init and run, enrollment, the dark gateway and the tunnel, with a streamed answer through them.

Every other e2e test runs as root, which hid a bug until 2026-12-05: the connections asked for Nagle's algorithm off
with `ChannelOptions.socketOption(.tcp_nodelay)`, which is SOL_SOCKET's option 1, SO_DEBUG, not TCP_NODELAY;
setting SO_DEBUG needs CAP_NET_ADMIN, so for any other user the controller reset every connection it accepted and
the gateway could reach neither its controller nor its backend. The source check below keeps the class out."""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from conftest import REPO_ROOT, Backend, ManagedProcess, cli_env, free_port

pytestmark = pytest.mark.e2e

SERVICE = "claude-api"
USER = "nobody"


def as_user(argv: list[str]) -> list[str]:
    account = pwd.getpwnam(USER)
    return ["setpriv", f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups", *argv]


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A directory the unprivileged user owns, outside pytest's root-only tmp tree (which it could not enter)."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run the overlay as another user")
    path = Path(tempfile.mkdtemp(prefix="ils-unprivileged-"))
    path.chmod(0o755)
    account = pwd.getpwnam(USER)
    os.chown(path, account.pw_uid, account.pw_gid)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def cli(binary: Path, root: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(as_user([str(binary), *args]), cwd=root, env=cli_env(), capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(args)}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def test_the_overlay_runs_without_privileges(workdir: Path, ils_bin: Path, tmp_path: Path) -> None:
    binary = workdir / "ils-gateway"
    shutil.copyfile(ils_bin, binary)
    binary.chmod(0o755)
    port = free_port()
    cli(binary, workdir, "controller", "init", "--state-dir", "state", "--address", f"https://127.0.0.1:{port}")
    controller = ManagedProcess("controller-u", as_user([str(binary), "controller", "run", "--state-dir", "state",
                                                         "--listen", f"127.0.0.1:{port}", "--log-level", "info"]),
                                tmp_path, cwd=workdir, env=cli_env())
    backend = Backend(tmp_path)
    tunnel_port = free_port()
    gateway = ManagedProcess("gateway-u", as_user([str(binary), "serve", "--mode", "ziti", "--identity",
                                                   "identities/gw.json", "--service", SERVICE, "--backend",
                                                   backend.url, "--log-level", "info"]),
                             tmp_path, cwd=workdir, env=cli_env())
    tunnel = ManagedProcess("tunnel-u", as_user([str(binary), "tunnel", "--identity", "identities/ipad.json",
                                                 "--service", SERVICE, "--listen", f"127.0.0.1:{tunnel_port}",
                                                 "--log-level", "info"]),
                            tmp_path, cwd=workdir, env=cli_env())
    try:
        controller.start()
        controller.wait_for_log("controller listening")
        for name, role in (("gw", "gateway"), ("ipad", "device")):
            cli(binary, workdir, "admin", "identity", "create", name, "--role", role, "-o", f"{name}.jwt")
            cli(binary, workdir, "enroll", f"{name}.jwt")
            owner = (workdir / "identities" / f"{name}.json").stat().st_uid
            assert owner == pwd.getpwnam(USER).pw_uid
        backend.start()
        gateway.start()
        gateway.wait_for_log("hosting service")
        tunnel.start()
        tunnel.wait_for_log("tunnel listening")
        done = subprocess.run(["curl", "-sSN", "--max-time", "30",
                               f"http://127.0.0.1:{tunnel_port}/claude/stream?prompt=hi&n=3&interval_ms=10"],
                              capture_output=True, text=True, timeout=40)
        events = re.findall(r'^data: \{"index": (\d+)', done.stdout, flags=re.M)
        assert events == ["0", "1", "2"], f"{done.stdout}\n{done.stderr}\n{tunnel.logs()[-2000:]}"
    finally:
        for process in (tunnel, gateway, backend, controller):
            process.stop()


def test_no_socket_option_names_a_tcp_option_at_the_socket_level() -> None:
    """`.socketOption(X)` is level SOL_SOCKET: a TCP option there is another option (TCP_NODELAY is SO_DEBUG)."""
    found = []
    for path in [*(REPO_ROOT / "Sources").rglob("*.swift"), *(REPO_ROOT / "Tests").rglob("*.swift")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"socketOption\(\s*\.tcp_", line):
                found.append(f"{path.relative_to(REPO_ROOT)}:{number}: {line.strip()}")
    assert not found, "use .tcpOption(...) for TCP-level options:\n" + "\n".join(found)
