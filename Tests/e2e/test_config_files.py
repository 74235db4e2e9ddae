"""Config files with the real binary: flags > environment > file > defaults, and every refusal (unknown key, wrong
type, not YAML, missing file, unreadable file) as one sentence on stderr with its own exit status, nothing started."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Optional

import pytest

from conftest import REPO_ROOT, ManagedProcess, cli_env, free_port, port_accepts

pytestmark = pytest.mark.e2e

REFUSAL_TIMEOUT_S = 15.0


@pytest.fixture
def tmp() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ils-config-") as d:
        yield Path(d)


def env(**extra: str) -> dict[str, str]:
    e = {k: v for k, v in cli_env().items() if not k.startswith(("ILS_", "NETWORKING_MODE", "BACKEND_URL"))}
    e.update(extra)
    return e


def run(binary: Path, *args: str, cwd: Path, environment: Optional[dict[str, str]] = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(binary), *args], cwd=cwd, env=environment or env(), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=REFUSAL_TIMEOUT_S)


def refused(result: subprocess.CompletedProcess, status: int, *phrases: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == status, f"exit {result.returncode}, wanted {status}; stderr: {result.stderr!r}"
    assert len(lines) == 1 and lines[0].startswith("ils-gateway: "), f"not one sentence: {result.stderr!r}"
    for phrase in phrases:
        assert phrase in lines[0], f"{phrase!r} not in {lines[0]!r}"
    assert result.stdout == ""


@pytest.mark.parametrize("command", [["serve"], ["tunnel"], ["controller", "run"]])
def test_unknown_key_is_refused_by_name(ils_bin: Path, tmp: Path, command: list[str]) -> None:
    port = free_port()
    config = tmp / "role.yaml"
    config.write_text(f"listen: 127.0.0.1:{port}\nlisten-adress: 127.0.0.1:{port}\n")
    result = run(ils_bin, *command, "--config", str(config), "--log-level", "debug", cwd=tmp)
    refused(result, 93, str(config), "line 2", "unknown key 'listen-adress'", " ".join(command))
    assert not port_accepts(port), "something started despite the refusal"


def test_key_of_another_role_is_unknown(ils_bin: Path, tmp: Path) -> None:
    config = tmp / "tunnel.yaml"
    config.write_text("backend: http://127.0.0.1:8000\n")
    refused(run(ils_bin, "tunnel", "--config", str(config), cwd=tmp), 93, "unknown key 'backend' for tunnel")


@pytest.mark.parametrize(("text", "status", "phrase"), [
    ("backend-max-connections: many\n", 94, "'backend-max-connections' must be a whole number, not 'many'"),
    ("plain-http: sometimes\n", 94, "'plain-http' must be true or false"),
    ("listen: [127.0.0.1, 8443]\n", 94, "'listen' must be a single value, not a list"),
    ("mode: tcp\n", 94, "'tcp' is not a valid value for 'mode'"),
    ("listen: [unclosed\n", 92, "is not valid YAML"),
    ("- listen\n", 92, "must be a list of 'key: value' lines"),
])
def test_bad_values_are_refused(ils_bin: Path, tmp: Path, text: str, status: int, phrase: str) -> None:
    config = tmp / "gateway.yaml"
    config.write_text(text)
    refused(run(ils_bin, "serve", "--config", str(config), cwd=tmp), status, str(config), phrase)


@pytest.mark.parametrize("size", ["512KiB", "8MiB"])
def test_resume_buffer_out_of_range_is_refused_before_any_file_is_read(ils_bin: Path, tmp: Path, size: str) -> None:
    """Below 640 KiB a circuit could fill before the device owes an ACK and wait for its ACK of last resort, 1 s
    later, at every fill (a download through 64 KiB went at 64 KiB a second); above 4 MiB a device may refuse the
    circuit. The option is checked before the identity file is read: its own refusal, not "no identity file"."""
    refused(run(ils_bin, "serve", "--resume-buffer", size, cwd=tmp), 64,
            "--resume-buffer must be between 640KiB and 4MiB")
    assert list(tmp.iterdir()) == [], "a refusal wrote something"


def test_resume_per_identity_below_a_circuit_floor_is_refused(ils_bin: Path, tmp: Path) -> None:
    """Each circuit keeps up to 640 KiB whatever its device's bound, so a smaller bound per identity would not hold.
    From the config file too, by its key."""
    refused(run(ils_bin, "serve", "--resume-per-identity", "512KiB", cwd=tmp), 64,
            "--resume-per-identity must be at least 640KiB")
    config = tmp / "gateway.yaml"
    config.write_text("resume-per-identity: 100KiB\n")
    refused(run(ils_bin, "serve", "--config", str(config), cwd=tmp), 64, "--resume-per-identity must be at least 640KiB")
    assert list(tmp.iterdir()) == [config], "a refusal wrote something"


def test_resume_held_per_identity_below_one_is_refused(ils_bin: Path, tmp: Path) -> None:
    """A cap of 0 held circuits per device would hold none: that is `--resume-grace 0`, which says so. From the config
    file too, by its key; refused before any file is read or written."""
    refused(run(ils_bin, "serve", "--resume-held-per-identity", "0", cwd=tmp), 64,
            "--resume-held-per-identity must be at least 1")
    config = tmp / "gateway.yaml"
    config.write_text("resume-held-per-identity: 0\n")
    refused(run(ils_bin, "serve", "--config", str(config), cwd=tmp), 64, "--resume-held-per-identity must be at least 1")
    assert list(tmp.iterdir()) == [config], "a refusal wrote something"


def test_missing_and_unreadable_files(ils_bin: Path, tmp: Path) -> None:
    missing = tmp / "nope.yaml"
    refused(run(ils_bin, "serve", "--config", str(missing), cwd=tmp), 90, f"config file {missing} does not exist")
    # A directory cannot be read as a file even by root (tests often run as root, where mode 000 reads fine).
    refused(run(ils_bin, "tunnel", "--config", str(tmp), cwd=tmp), 91, f"config file {tmp} cannot be read")
    if os.geteuid() != 0:
        locked = tmp / "locked.yaml"
        locked.write_text("service: claude-api\n")
        locked.chmod(0)
        refused(run(ils_bin, "tunnel", "--config", str(locked), cwd=tmp), 91, "cannot be read")


def test_config_from_environment_variable(ils_bin: Path, tmp: Path) -> None:
    config = tmp / "tunnel.yaml"
    config.write_text("bogus: 1\n")
    refused(run(ils_bin, "tunnel", cwd=tmp, environment=env(ILS_CONFIG=str(config))), 93, "unknown key 'bogus'")


def listens_on(binary: Path, tmp: Path, expected: int, args: list[str], environment: dict[str, str]) -> None:
    proc = ManagedProcess("gateway-precedence", [str(binary), "serve", *args], tmp, cwd=tmp, env=environment)
    proc.start()
    try:
        proc.wait_for_port(expected)
    finally:
        proc.stop()


def test_precedence_flag_over_environment_over_file(ils_bin: Path, tmp: Path) -> None:
    file_port, env_port, flag_port = free_port(), free_port(), free_port()
    config = tmp / "gateway.yaml"
    config.write_text(
        "mode: http\n"
        "plain-http: true\n"
        f"listen: 127.0.0.1:{file_port}\n"
        "backend: http://127.0.0.1:9\n"
        "log-level: debug\n"
    )
    base = ["--config", str(config)]
    listens_on(ils_bin, tmp, file_port, base, env())
    listens_on(ils_bin, tmp, env_port, base, env(ILS_LISTEN=f"127.0.0.1:{env_port}"))
    listens_on(ils_bin, tmp, flag_port, base + ["--listen", f"127.0.0.1:{flag_port}"],
               env(ILS_LISTEN=f"127.0.0.1:{env_port}"))
    # A switch set in the file is turned off by its --no- flag: without cleartext, HTTP mode wants certificates.
    result = run(ils_bin, "serve", *base, "--no-plain-http", cwd=tmp)
    assert result.returncode == 64 and "needs --tls-cert and --tls-key" in result.stderr, result.stderr
    # The environment's mode beats the file's: NETWORKING_MODE=ziti makes it an overlay gateway, which then wants
    # its identity file (absent here) instead of listening.
    result = run(ils_bin, "serve", *base, cwd=tmp, environment=env(NETWORKING_MODE="ziti"))
    assert result.returncode != 0 and "identities/gateway.json" in result.stderr, result.stderr


def test_shipped_examples_are_accepted_by_the_binary(ils_bin: Path, tmp: Path) -> None:
    """Each example gets past the config check; what stops it next is the absent identity or certificate file."""
    for name, command in [("gateway.yaml", ["serve"]), ("gateway-http.yaml", ["serve"]),
                          ("tunnel.yaml", ["tunnel"]), ("controller.yaml", ["controller", "run"])]:
        result = run(ils_bin, *command, "--config", str(REPO_ROOT / "deploy" / "config" / name), cwd=tmp)
        assert result.returncode not in range(90, 95), f"{name}: {result.stderr}"
        assert result.returncode != 0
