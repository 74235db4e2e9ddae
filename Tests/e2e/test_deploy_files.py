"""The deployment files under deploy/: the compose files publish no port for the gateway, the Dockerfile builds with
the README's command, the .env examples cover what compose reads, the two-controller files (deploy/cluster, the
PostgreSQL drop-ins and the join unit) keep the password out of every file and wait for a healthy database, and the
systemd units pass `systemd-analyze verify` (deploy/systemd/verify.sh) with the hardening the units promise.

There is no Docker engine where these run, so `docker compose config` is not: the compose files are read as YAML and
their interpolation is done here, the way compose does it (`${VAR:-default}`, `$$`)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, ManagedProcess, cli_env, free_port

DEPLOY = REPO_ROOT / "deploy"
CLUSTER = DEPLOY / "cluster"
SYSTEMD = DEPLOY / "systemd"


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
    with Swift's run-time exclusivity checks off (docs/design/runtime-tuning.md says why)."""
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
    assert "ils-controller-join.service" in proc.stdout, "verify.sh did not check the join unit"
    for dropin in sorted(SYSTEMD.glob("*.service.d/*.conf")):
        assert f"{dropin.parent.name}/{dropin.name}" in proc.stdout, f"verify.sh did not check {dropin.name}"


# The two-controller deployment: deploy/cluster/docker-compose.yml and the systemd drop-ins and join unit.

def cluster_text() -> str:
    return (CLUSTER / "docker-compose.yml").read_text()


def cluster() -> dict:
    return yaml.safe_load(cluster_text())


def cluster_env_example() -> dict[str, str]:
    text = (CLUSTER / ".env.example").read_text()
    return dict(re.findall(r"^([A-Z_]+)=(.*)$", text, re.M))


def interpolate(value: str) -> str:
    """What compose makes of `value` with the .env example's settings: `${VAR:-default}` and `${VAR}` replaced,
    `$$` left as the `$` the container's shell sees."""
    env = cluster_env_example()

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(2) or "")

    return re.sub(r"\$\$|\$\{([A-Z_]+)(?::-([^}]*))?\}", one, value)


def controllers() -> dict[str, dict]:
    return {name: s for name, s in cluster()["services"].items() if name.startswith("controller-")}


def test_cluster_gateway_publishes_no_port() -> None:
    gateway = cluster()["services"]["gateway"]
    assert "ports" not in gateway and "expose" not in gateway, "the dark gateway must publish nothing"
    assert gateway.get("network_mode") is None, "host networking would put the gateway on the host's ports"
    assert interpolate(gateway["environment"]["NETWORKING_MODE"]) == "ziti", "the cluster's gateway is the overlay one"


def test_cluster_backend_and_database_are_internal_only() -> None:
    c = cluster()
    backend, postgres = c["services"]["backend"], c["services"]["postgres"]
    assert "ports" not in backend and backend["networks"] == ["internal"]
    assert "ports" not in postgres and "expose" not in postgres and postgres["networks"] == ["store"]
    for network in ("internal", "store"):
        assert c["networks"][network].get("internal") is True, f"the {network} network has a route out"
    on_store = {name for name, s in c["services"].items() if "store" in s.get("networks", {})}
    assert on_store == {"postgres", "controller-a", "controller-b"}, f"only the controllers reach the database: {on_store}"


def test_cluster_both_controllers_publish_the_port_of_their_address() -> None:
    """Each controller listens, inside its container, on the port of the address it hands out, and publishes that
    port: the gateway inside the compose network and devices outside dial the same URL."""
    found = controllers()
    assert set(found) == {"controller-a", "controller-b"}
    ports = set()
    for name, service in found.items():
        environment = {k: interpolate(str(v)) for k, v in service["environment"].items()}
        address = re.fullmatch(r"https://([^:/]+):(\d+)", environment["CONTROLLER_ADDRESS"])
        assert address, f"{name}: CONTROLLER_ADDRESS is not https://HOST:PORT"
        assert environment["ILS_LISTEN"] == f"0.0.0.0:{address.group(2)}"
        published = [interpolate(str(p)) for p in service.get("ports", [])]
        assert published == [f"{address.group(2)}:{address.group(2)}"], f"{name} publishes {published}"
        aliases = service["networks"]["edge"]["aliases"]
        assert [interpolate(a) for a in aliases] == [address.group(1)], f"{name}'s name does not resolve to it inside"
        ports.add(address.group(2))
    assert len(ports) == 2, "the two controllers publish the same host port"


def test_cluster_controllers_wait_for_a_healthy_database_and_b_for_a() -> None:
    c = cluster()
    assert "pg_isready" in " ".join(c["services"]["postgres"]["healthcheck"]["test"])
    for name, service in controllers().items():
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", f"{name} may start before it"
        assert "/readyz" in " ".join(service["healthcheck"]["test"])
    assert controllers()["controller-b"]["depends_on"]["controller-a"]["condition"] == "service_healthy", (
        "controller-b joins from controller-a, so it must wait until controller-a serves"
    )


def test_cluster_controller_scripts_init_or_join_only_an_empty_state_then_run() -> None:
    """The scripts parse (sh -n, after compose's interpolation), make the state only when the state directory is
    empty, and end by exec-ing the controller, so SIGTERM reaches it."""
    steps = {"controller-a": "ils-gateway controller init", "controller-b": "ils-gateway controller join"}
    for name, service in controllers().items():
        assert service["entrypoint"] == ["/bin/sh", "-c"]
        script = interpolate(service["command"][0])
        subprocess.run(["sh", "-n", "-c", script], check=True, timeout=10)
        guarded = re.search(r'if \[ -z "\$\(ls -A "\$ILS_STATE_DIR" 2>/dev/null\)" \]; then\n\s*(.*)\n\s*fi', script)
        assert guarded and guarded.group(1).startswith(steps[name]), f"{name} does not guard {steps[name]}"
        assert script.count(steps[name]) == 1
        assert script.rstrip().splitlines()[-1].startswith("exec ils-gateway controller run"), name
    assert "--admin-out /var/lib/ils/identities/admin.json" in interpolate(controllers()["controller-a"]["command"][0])
    assert "--identity /var/lib/ils/identities/admin.json" in interpolate(controllers()["controller-b"]["command"][0])
    b_volumes = controllers()["controller-b"]["volumes"]
    assert "cluster-admin:/var/lib/ils/identities:ro" in b_volumes, "controller-b reads the admin identity, read-only"


def test_cluster_volumes_for_the_image_user_start_owned_by_it() -> None:
    """A new named volume takes the owner of the image directory it is mounted on; every target the ils image's
    services mount is /var/lib/ils or a directory the Dockerfile makes for user ils."""
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    owned = {"/var/lib/ils"} | set(re.findall(r"install -d -o ils -g ils -m 0700 (\S+)", dockerfile))
    for name, service in cluster()["services"].items():
        if service.get("image") != "ils-gateway:local":
            continue
        for volume in service.get("volumes", []):
            target = volume.split(":")[1]
            assert target in owned, f"{name} mounts a volume on {target}, which the image does not give user ils"


PASSWORD_ASSIGNMENT = re.compile(r"(POSTGRES_PASSWORD|PGPASSWORD)\s*[:=]\s*(\S*)")
URL_WITH_PASSWORD = re.compile(r"[a-z]+://[^/@\s:]+:[^/@\s]+@")


def cluster_secret_files() -> list[Path]:
    return [CLUSTER / "docker-compose.yml", CLUSTER / ".env.example", *sorted(SYSTEMD.glob("*.service")),
            *sorted(SYSTEMD.glob("*.service.d/*.conf"))]


def test_no_password_literal_in_the_cluster_compose_env_example_or_units() -> None:
    for path in cluster_secret_files():
        lines = [line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")]
        for line in lines:
            url_line = interpolate(line) if path.parent == CLUSTER else line
            assert not URL_WITH_PASSWORD.search(url_line), f"{path.name}: a URL with a password: {line.strip()}"
            for key, value in PASSWORD_ASSIGNMENT.findall(line):
                assert value == "$$(cat", f"{path.name}: {key} is set to something other than the secret: {line}"
    postgres = cluster()["services"]["postgres"]
    assert postgres["environment"]["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres-password"
    assert set(cluster()["secrets"]["postgres-password"]) == {"file"}, "the secret is a file, not an environment value"
    for name, service in controllers().items():
        assert service["secrets"] == ["postgres-password"], name
        assert "PGPASSWORD=$(cat /run/secrets/postgres-password)" in interpolate(service["command"][0]), name


def test_the_password_file_is_never_in_git_or_the_image() -> None:
    relative = (CLUSTER / cluster_env_example()["POSTGRES_PASSWORD_FILE"]).resolve().relative_to(REPO_ROOT)
    for ignore in (REPO_ROOT / ".gitignore", DEPLOY / "Dockerfile.dockerignore"):
        assert str(relative) in ignore.read_text().splitlines(), f"{ignore.name} does not leave out {relative}"


def test_cluster_env_example_covers_compose_variables() -> None:
    used = set(re.findall(r"(?<!\$)\$\{([A-Z_]+)", cluster_text()))
    defined = set(cluster_env_example())
    assert {"CONTROLLER_A_HOST", "CONTROLLER_B_HOST", "POSTGRES_PASSWORD_FILE"} <= used
    assert used <= defined, f"compose reads variables the example does not show: {used - defined}"


def controller_state_dir() -> str:
    config = yaml.safe_load((DEPLOY / "config" / "controller.yaml").read_text())
    return config["state-dir"]


def test_controller_store_dropins_take_the_store_from_a_file_and_order_after_local_postgres() -> None:
    """The drop-ins only add: they set nothing that could undo the unit's hardening."""
    store = (SYSTEMD / "ils-controller.service.d" / "store.conf").read_text()
    local = (SYSTEMD / "ils-controller.service.d" / "local-postgres.conf").read_text()
    assert "EnvironmentFile=/etc/ils-gateway/controller-store.env\n" in store
    assert "Wants=postgresql.service\n" in local and "After=postgresql.service\n" in local
    for path in sorted(SYSTEMD.glob("*.service.d/*.conf")):
        keys = set(re.findall(r"^(\w+)=", path.read_text(), re.M))
        assert keys <= {"EnvironmentFile", "Wants", "After"}, f"{path.name} sets {keys - {'EnvironmentFile', 'Wants', 'After'}}"


def test_join_unit_is_hardened_and_runs_as_the_controller() -> None:
    text = (SYSTEMD / "ils-controller-join.service").read_text()
    # A failed join is read and started again by the operator, not retried in a loop: no Restart=on-failure.
    for line in UNIT_HARDENING:
        if line != "Restart=on-failure":
            assert line in text, f"ils-controller-join.service lacks {line.strip()}"
    assert "AF_PACKET" not in text and "AF_NETLINK" not in text
    assert "Type=oneshot\n" in text and re.search(r"^TimeoutStartSec=\d+", text, re.M), "a one-shot waits for ever"
    assert "User=ils-controller\n" in text, "the join must write files as the controller's own dynamic user"
    assert "StateDirectory=ils-controller\n" in text
    state = controller_state_dir()
    assert f"ConditionPathExists=!{state}/controller.json\n" in text
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M)
    assert exec_start and f"--state-dir {state} " in exec_start.group(1)
    assert "--identity %d/admin.json" in exec_start.group(1), "the admin identity comes as a credential"
    assert "LoadCredential=admin.json:/etc/ils-gateway/join-admin.json\n" in text
    assert "Before=ils-controller.service\n" in text
    assert "[Install]" not in text, "the join is started by hand, once; it is not enabled"


def test_bounded_runner_stops_a_hang_with_its_whole_session_and_passes_exit_codes_through() -> None:
    """deploy/bounded.sh (around the Swift test runs in deploy/test.sh): a command past its bound is stopped, every
    process it started too (its output pipe closes, so CI's log reader is not left waiting), and a finished
    command's exit status is its own."""
    bounded = str(DEPLOY / "bounded.sh")
    quick = subprocess.run([bounded, "30", "quick", "bash", "-c", "echo out; exit 3"], capture_output=True,
                           text=True, timeout=20)
    assert quick.returncode == 3 and quick.stdout == "out\n", quick
    hang = subprocess.run([bounded, "2", "hang", "bash", "-c", "sleep 300 & sleep 300"], capture_output=True,
                          text=True, timeout=60)
    assert hang.returncode == 143, hang
    assert "hang: still running after 2s" in hang.stderr
    leftovers = subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True, text=True)
    assert leftovers.stdout == "", f"processes left behind: {leftovers.stdout}"


def dockerfile_healthcheck() -> tuple[list[str], str]:
    """The image's HEALTHCHECK command (exec form) and the ILS_METRICS address the image sets."""
    text = (DEPLOY / "Dockerfile").read_text().replace("\\\n", " ")
    check = re.search(r"^HEALTHCHECK\b.*?\bCMD\s+(\[.*\])\s*$", text, re.MULTILINE)
    metrics = re.search(r"^ENV ILS_METRICS=(\S+)\s*$", text, re.MULTILINE)
    assert check and metrics, "the Dockerfile has no HEALTHCHECK or no ENV ILS_METRICS"
    return json.loads(check.group(1)), metrics.group(1)


def test_dockerfile_healthcheck_probes_healthz_on_the_address_the_image_sets() -> None:
    command, metrics = dockerfile_healthcheck()
    assert metrics == "127.0.0.1:9464"
    assert command[:2] == ["bash", "-c"]
    assert "/dev/tcp/127.0.0.1/9464" in command[2] and "GET /healthz" in command[2]


def test_dockerfile_healthcheck_passes_on_a_running_role_and_fails_once_it_stops(
    ils_bin: Path, tmp_path: Path
) -> None:
    """The image's own check command, run against the real binary: a role given only ILS_METRICS (no --metrics) is
    healthy, and the same check fails once it has stopped."""
    command, _ = dockerfile_healthcheck()
    port = free_port()
    probe = [*command[:2], command[2].replace("/9464", f"/{port}")]
    env = {**cli_env(), "ILS_METRICS": f"127.0.0.1:{port}"}
    args = [str(ils_bin), "serve", "--mode", "http", "--plain-http", "--listen", f"127.0.0.1:{free_port()}",
            "--backend", f"http://127.0.0.1:{free_port()}"]
    gateway = ManagedProcess("gateway-health", args, tmp_path, env=env)
    gateway.start()
    try:
        gateway.wait_for_port(port)
        assert subprocess.run(probe, timeout=10).returncode == 0, gateway.logs()
    finally:
        gateway.stop()
    assert subprocess.run(probe, timeout=10).returncode != 0
