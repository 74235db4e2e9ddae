"""Services and policies end to end (issue 26, item 0), with the real binary: the FastAPI sample backend behind
`claude-api` and `ils-bench backend` behind `second-api`, each hosted by its own `serve`; devices reach each through
tunnels. A dial policy narrowed with `admin service update` ends a live SSE stream of a device it leaves out before
the command returns, and refuses its new requests (403 dial_denied); an attribute change does the same; a deleted
service loses its circuits; refused changes write nothing."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

from conftest import Backend, Controller, ManagedProcess, cli_env, free_port
from test_overlay import Tunnel

pytestmark = pytest.mark.e2e

END_BOUND_S = 10.0  # a cut stream must end well within this after the command returned


class ServiceTunnel(Tunnel):
    """A tunnel to a service other than claude-api."""

    def __init__(self, controller: Controller, identity: str, service: str, log_dir: Path) -> None:
        super().__init__(controller, identity, log_dir)
        self.args[self.args.index("--service") + 1] = service
        self.name = f"tunnel-{identity}-{service}"


@dataclass
class Services:
    controller: Controller
    fastapi: Backend
    bench: ManagedProcess
    bench_port: int
    claude_phone: ServiceTunnel
    second_phone: ServiceTunnel
    claude_laptop: ServiceTunnel
    log_dir: Path


def create(controller: Controller, name: str, role: str, *extra: str) -> None:
    r = controller.cli("admin", "identity", "create", name, "--role", role, *extra, "-o", f"{name}.jwt")
    assert r.returncode == 0, r.describe()
    r = controller.cli("enroll", f"{name}.jwt")
    assert r.returncode == 0, r.describe()


def serve(controller: Controller, identity: str, service: str, backend_url: str, log_dir: Path) -> ManagedProcess:
    gateway = ManagedProcess(
        f"serve-{service}",
        [str(controller.binary), "serve", "--identity", f"identities/{identity}.json", "--service", service,
         "--backend", backend_url, "--log-level", "info"],
        log_dir,
        cwd=controller.root,
        env=cli_env(),
    )
    gateway.start()
    gateway.wait_for_log("hosting service")
    return gateway


@pytest.fixture(scope="module")
def services(controller: Controller, ils_bin: Path) -> Iterator[Services]:
    log_dir = controller.log_dir
    started: list[ManagedProcess] = []
    try:
        fastapi = Backend(log_dir)
        fastapi.start()
        started.append(fastapi)
        bench_port = free_port()
        bench = ManagedProcess(
            "bench-backend",
            [str(ils_bin.parent / "ils-bench"), "backend", "--port", str(bench_port)],
            log_dir,
        )
        bench.start()
        bench.wait_for_port(bench_port)
        started.append(bench)

        create(controller, "gw-claude", "gateway")
        create(controller, "gw-second", "gateway", "--attributes", "second")
        create(controller, "phone", "device", "--attributes", "ipad")
        create(controller, "laptop", "device")
        r = controller.cli("admin", "service", "create", "second-api", "--bind", "#second")
        assert r.returncode == 0, r.describe()
        assert "created second-api: dial anyOf(role:device), bind anyOf(#second)" in r.stdout, r.stdout
        started.append(serve(controller, "gw-claude", "claude-api", fastapi.url, log_dir))
        started.append(serve(controller, "gw-second", "second-api", f"http://127.0.0.1:{bench_port}", log_dir))

        tunnels = [
            ServiceTunnel(controller, "phone", "claude-api", log_dir),
            ServiceTunnel(controller, "phone", "second-api", log_dir),
            ServiceTunnel(controller, "laptop", "claude-api", log_dir),
        ]
        for tunnel in tunnels:
            tunnel.start()
            started.append(tunnel)
        yield Services(controller, fastapi, bench, bench_port, *tunnels, log_dir)
    finally:
        for process in reversed(started):
            process.stop()


def service_list(controller: Controller) -> dict[str, dict]:
    r = controller.cli("admin", "service", "list", "--json")
    assert r.returncode == 0, r.describe()
    return {s["name"]: s for s in json.loads(r.stdout)}


def audit_actions(controller: Controller) -> list[dict]:
    r = controller.cli("admin", "audit", "--json")
    assert r.returncode == 0, r.describe()
    return json.loads(r.stdout)["entries"] if r.stdout.lstrip().startswith("{") else json.loads(r.stdout)


class Stream:
    """An SSE stream read on a thread: when it ended, and how many events it carried."""

    def __init__(self, tunnel: Tunnel) -> None:
        self.events = 0
        self.ended_at: Optional[float] = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(tunnel,), daemon=True)
        self.thread.start()
        assert self.first.wait(10), "the stream never delivered its first event"

    def _read(self, tunnel: Tunnel) -> None:
        try:
            with tunnel.client(timeout=60) as c:
                with c.stream("GET", "/claude/stream", params={"n": 10000, "interval_ms": 50}) as r:
                    assert r.status_code == 200
                    for line in r.iter_lines():
                        if line.startswith("data:"):
                            self.events += 1
                            self.first.set()
        except httpx.HTTPError:
            pass
        finally:
            self.ended_at = time.monotonic()
            self.first.set()


def test_two_services_reach_two_backends(services: Services) -> None:
    with services.claude_phone.client() as c:
        assert c.get("/health").status_code == 200  # FastAPI
    with services.second_phone.client() as c:
        assert c.get("/small").status_code == 200  # ils-bench
        assert c.get("/health").status_code == 404  # not FastAPI: the other backend
    listed = service_list(services.controller)
    assert set(listed) == {"claude-api", "second-api"}
    assert [h["gateway"] for h in listed["claude-api"]["hosts"]] == ["gw-claude"]
    assert [h["gateway"] for h in listed["second-api"]["hosts"]] == ["gw-second"]
    assert listed["second-api"]["bind"] == {"semantic": "anyOf", "tokens": ["#second"]}
    r = services.controller.cli("admin", "service", "show", "claude-api")
    assert r.returncode == 0 and "may dial:  laptop,phone" in r.stdout, r.describe()


def test_narrowing_ends_a_live_stream_before_the_command_returns(services: Services) -> None:
    c = services.controller
    laptop = Stream(services.claude_laptop)
    phone = Stream(services.claude_phone)
    try:
        r = c.cli("admin", "service", "update", "claude-api", "--dial", "#ipad")
        returned = time.monotonic()
        assert r.returncode == 0 and "revision 2" in r.stdout, r.describe()
        laptop.thread.join(END_BOUND_S)
        assert laptop.ended_at is not None, "the laptop's stream went on after its permission was taken away"
        print(f"laptop's stream ended {1000 * (laptop.ended_at - returned):.0f} ms after update returned")
        # Two more events on the phone's stream, sent after the cut that ended the laptop's: the bound on its being cut.
        before = phone.events
        deadline = time.monotonic() + END_BOUND_S
        while phone.events < before + 2 and phone.ended_at is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert phone.ended_at is None and phone.events >= before + 2, "the phone, still allowed, lost its stream"
        with services.claude_laptop.client() as client:
            refused = client.get("/health")
        assert refused.status_code == 403 and refused.json()["code"] == "dial_denied", refused.text

        # An attribute change cuts the same way.
        r = c.cli("admin", "identity", "update", "phone", "--attributes", "")
        assert r.returncode == 0 and "attributes none" in r.stdout, r.describe()
        phone.thread.join(END_BOUND_S)
        assert phone.ended_at is not None, "the phone's stream went on after its attribute was removed"
        actions = [e["action"] for e in audit_actions(c)]
        assert "service.update" in actions and "identity.attributes" in actions and "circuit.cut" in actions
    finally:
        assert c.cli("admin", "identity", "update", "phone", "--attributes", "ipad").returncode == 0
        assert c.cli("admin", "service", "update", "claude-api", "--dial", "role:device").returncode == 0
    with services.claude_laptop.client() as client:
        assert client.get("/health").status_code == 200


def test_refused_changes_write_nothing(services: Services) -> None:
    c = services.controller
    before = service_list(c)
    audit_before = len(audit_actions(c))
    for args, code, text in [
        (["create", "bad", "--dial", "role:owner"], 64, "names no role"),
        (["create", "bad", "--dial", "#all,role:device"], 64, "'#all' stands alone"),
        (["create", "second-api"], 79, "already exists"),
        (["update", "claude-api", "--dial", "@ghost"], 67, "no identity named 'ghost'"),
        (["update", "nothing", "--dial", "role:device"], 67, "no service named"),
        (["create", "bad\x1b[2J"], 64, ""),
    ]:
        r = c.cli("admin", "service", *args)
        assert r.returncode == code, f"{args}: {r.describe()}"
        assert text in r.stderr, f"{args}: {r.describe()}"
        assert "\x1b" not in r.stderr
    # `#all` means everyone: an attribute named `all` would let a policy meant for a few match everybody.
    r = c.cli("admin", "identity", "update", "laptop", "--attributes", "all")
    assert r.returncode == 64 and "cannot be an attribute" in r.stderr, r.describe()
    shown = json.loads(c.cli("admin", "identity", "show", "laptop", "--json").stdout)
    assert shown["attributes"] == [], shown
    assert service_list(c) == before
    assert len(audit_actions(c)) == audit_before, "a refused change left an audit row"


def test_deleting_a_service_ends_its_circuits_and_refuses_new_ones(services: Services) -> None:
    c = services.controller
    with services.second_phone.client() as client:
        assert client.get("/small").status_code == 200
    r = c.cli("admin", "service", "delete", "second-api")
    assert r.returncode == 0, r.describe()
    with services.second_phone.client(timeout=10) as client:
        refused = client.get("/small")
    assert refused.status_code == 404 and refused.json()["code"] == "unknown_service", refused.text
    assert "second-api" not in service_list(c)
