"""The deployment files under deploy/: the compose file publishes no port for the gateway, the Dockerfile builds with
the README's command, the .env example covers what compose reads, and the systemd units pass
`systemd-analyze verify` (deploy/systemd/verify.sh) with the hardening the units promise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())


def test_gateway_publishes_no_port() -> None:
    services = compose()["services"]
    gateway = services["gateway"]
    assert "ports" not in gateway and "expose" not in gateway, "the dark gateway must publish nothing"
    assert gateway.get("network_mode") is None, "host networking would put the gateway on the host's ports"


def test_backend_is_internal_only_and_controller_publishes_its_port() -> None:
    c = compose()
    backend = c["services"]["backend"]
    assert "ports" not in backend and backend["networks"] == ["internal"]
    assert c["networks"]["internal"]["internal"] is True
    controller = c["services"]["controller"]
    assert any(str(p).endswith(":7443") for p in controller["ports"])


def test_env_example_covers_compose_variables() -> None:
    text = (DEPLOY / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)", text))
    example = (DEPLOY / ".env.example").read_text()
    defined = set(re.findall(r"^([A-Z_]+)=", example, re.M))
    assert {"NETWORKING_MODE", "BACKEND_URL"} <= defined
    assert used <= defined, f"compose reads variables the example does not show: {used - defined}"


def test_dockerfile_builds_with_the_readme_command() -> None:
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    readme = (REPO_ROOT / "README.md").read_text()
    assert len(re.findall(r"^FROM ", dockerfile, re.M)) == 2, "multi-stage: a build stage and a slim runtime"
    builds = re.findall(r"(swift build -c release --product ils-gateway)", dockerfile)
    assert builds, "the Dockerfile does not run swift build"
    for command in builds:
        assert command in readme, f"README does not show the Dockerfile's build command: {command}"
    runtime = dockerfile.split("\nFROM ")[-1]
    assert "libsodium23" in runtime
    user = re.search(r"^USER (\S+)", runtime, re.M)
    assert user and user.group(1) not in ("root", "0"), "the runtime stage runs as root"


UNIT_HARDENING = ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                  "DynamicUser=yes", "StateDirectoryMode=0700", "UMask=0077", "Restart=on-failure",
                  "KillSignal=SIGTERM", "CapabilityBoundingSet=\n", "RestrictAddressFamilies=")


@pytest.mark.parametrize("unit", ["ils-controller.service", "ils-gateway.service", "ils-tunnel.service"])
def test_unit_is_hardened(unit: str) -> None:
    text = (DEPLOY / "systemd" / unit).read_text()
    for line in UNIT_HARDENING:
        assert line in text, f"{unit} lacks {line.strip()}"
    assert "AF_PACKET" not in text and "AF_NETLINK" not in text


def test_release_builds_are_the_shipped_build() -> None:
    """Every release build the project tells someone to run, and the one the benchmark measures, is the same build:
    with Swift's run-time exclusivity checks off (docs/architecture.md says why)."""
    flag = "-Xswiftc -enforce-exclusivity=unchecked"
    places = [DEPLOY / "Dockerfile", DEPLOY / "bench" / "run.sh", REPO_ROOT / "README.md"]
    places += [REPO_ROOT / "docs" / name for name in ("getting-started.md", "operations.md")]
    for path in places:
        commands = re.findall(r"swift build -c release[^\n]*", path.read_text())
        commands = [c for c in commands if "--show-bin-path" not in c]
        assert commands, f"{path.name}: no release build"
        for command in commands:
            assert flag in command, f"{path.name}: a release build without {flag}: {command}"


def test_systemd_analyze_verify(ils_bin: Path) -> None:
    proc = subprocess.run([str(DEPLOY / "systemd" / "verify.sh")], env={"ILS_BIN": str(ils_bin), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    if proc.returncode == 77:
        pytest.skip(proc.stderr.strip())
    print(proc.stdout)
    assert proc.returncode == 0, f"systemd-analyze verify refused the units:\n{proc.stdout}\n{proc.stderr}"
    assert "all units clean" in proc.stdout
