"""End-to-end tests of two controllers sharing one PostgreSQL (issue 25), with the real binary.

One set-up per module: a PostgreSQL server of its own (pg_fixture.py), controller A (`controller init --store`) and
replica B (`controller join`, then `controller run --store`) in one working directory, the sample backend, one overlay
gateway (`serve --mode ziti`) that learns the controller list from A and links to both, and devices enrolled through
A. A device's identity file lists its controllers; a test that needs a device to use one controller only rewrites its
copy's `controller`/`controllers`, and `admin-b.json` is the admin file pointed at B.

What each test proves is what a user would see: streams and requests through `tunnel`, revocations through
`admin identity revoke`, PostgreSQL restarted under the controllers' feet with `pg_ctl restart -m fast`. Each test
also checks the controller's own log line for the part only it does (B closing a device A revoked; A resuming its
change feed), since the gateway also hears a block from the controller the admin used and would cut a stream by
itself. Tests that disturb the set-up restore it, and the one that kills A comes last.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import httpx
import pytest

import pg_fixture
from conftest import Backend, Controller, ManagedProcess, cli_env
from sse_helpers import parse_sse, timed_lines
from test_faults import (Faulty, backend_streams, drain_until_end, gateway_process, open_stream, read_resumed_stream,
                         through_tunnel_ok, wait_until_flowing)
from test_overlay import Tunnel, enroll, wait_for_backend_log
from test_resume_refusals import wait_until

pytestmark = pytest.mark.e2e

FAILOVER_BOUND_S = 1.0  # issue 25: SIGKILL of a device's controller -> its next request answered through another
STREAM_END_BOUND_S = 10.0  # a stream whose controller died or whose device was revoked ends well within this
FEED_BOUND_S = 30.0  # PostgreSQL back -> each controller listens again (reconnect backoff included)
LINK_BOUND_S = 20.0  # the gateway links to a replica within a heartbeat (5 s) of hearing of it


class ClusterController(Controller):
    """A controller of the cluster: `controller run --store URL` with its own state directory and log name."""

    def __init__(self, name: str, binary: Path, root: Path, log_dir: Path, store: str) -> None:
        super().__init__(binary, root, log_dir)
        self.name = name
        self.store = store
        self.state_dir = root / f"state-{name}"

    def start(self) -> None:
        assert self.process is None or not self.process.alive(), f"controller {self.name} already running"
        self.process = ManagedProcess(
            f"controller-{self.name}",
            [str(self.binary), "controller", "run", "--state-dir", str(self.state_dir), "--store", self.store,
             "--listen", f"127.0.0.1:{self.port}", "--log-level", "info"],
            self.log_dir,
            cwd=self.root,
            env=cli_env(),  # PGPASSWORD comes from the environment, set by the fixture
        )
        self.process.start()
        self.process.wait_for_port(self.port)

    def full_log(self) -> str:
        return self.process.full_log() if self.process else ""

    def wait_for_log(self, text: str, timeout: float, after: int = 0) -> str:
        """Waits until `text` is in the log past its first `after` characters (a line written after a mark)."""
        assert self.process is not None
        return self.process.wait_for_log_count(text, after=after, timeout=timeout)


@dataclass
class Cluster:
    pg: pg_fixture.TestPostgres
    a: ClusterController
    b: ClusterController
    backend: Backend
    gateway: ManagedProcess
    root: Path
    log_dir: Path

    def identity_file(self, name: str) -> Path:
        return self.root / "identities" / f"{name}.json"

    def pin(self, name: str, *controllers: ClusterController) -> None:
        """Rewrites identity `name`'s file so that it dials only `controllers`, in that order."""
        path = self.identity_file(name)
        data = json.loads(path.read_text())
        data["controller"] = controllers[0].address
        data["controllers"] = [c.address for c in controllers]
        path.write_text(json.dumps(data, indent=2))

    def device(self, name: str, *controllers: ClusterController) -> Faulty:
        """A device enrolled through A, its file pinned to `controllers`, and its tunnel started (not yet probed)."""
        enroll(self.a, name, "device")
        if controllers:
            self.pin(name, *controllers)
        tunnel = Tunnel(self.a, name, self.log_dir)
        tunnel.start()
        return Faulty(self.a, self.backend, self.gateway, tunnel, self.log_dir, device=name)

    def revoke(self, name: str, through: ClusterController) -> None:
        admin = "identities/admin.json" if through is self.a else "identities/admin-b.json"
        r = through.cli("admin", "identity", "revoke", "--identity", admin, name)
        assert r.returncode == 0, f"revoking {name} through {through.name}\n{r.describe()}"


@pytest.fixture(scope="module")
def cluster(ils_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pg = pg_fixture.start_postgres()
    saved_password = os.environ.get("PGPASSWORD")
    processes: list[Optional[ManagedProcess]] = []
    controllers: list[ClusterController] = []
    try:
        store = pg.create_database()
        # The password reaches every controller command through the environment, never on a command line.
        os.environ["PGPASSWORD"] = pg_fixture.PASSWORD
        root = tmp_path_factory.mktemp("cluster")
        log_dir = tmp_path_factory.mktemp("cluster-logs")
        a = ClusterController("A", ils_bin, root, log_dir, store)
        b = ClusterController("B", ils_bin, root, log_dir, store)
        controllers += [a, b]
        r = a.cli("controller", "init", "--state-dir", str(a.state_dir), "--address", a.address, "--store", store)
        assert r.returncode == 0, f"controller init on PostgreSQL\n{r.describe()}"
        a.start()
        # A device enrolled while A was the whole cluster: its file lists A alone (issue 38's HA test).
        enroll(a, "early", "device")
        r = b.cli("controller", "join", "--identity", "identities/admin.json", "--address", b.address,
                  "--state-dir", str(b.state_dir))
        assert r.returncode == 0, f"controller join\n{r.describe()}"
        b.start()

        admin = json.loads((root / "identities" / "admin.json").read_text())
        admin["controller"], admin["controllers"] = b.address, [b.address]
        (root / "identities" / "admin-b.json").write_text(json.dumps(admin, indent=2))
        os.chmod(root / "identities" / "admin-b.json", 0o600)

        backend = Backend(log_dir)
        processes.append(backend)
        backend.start()
        enroll(a, "gw-c", "gateway")
        gateway = gateway_process(a, backend, log_dir, identity="gw-c")
        processes.append(gateway)
        gateway.start()
        gateway.wait_for_log("hosting service")
        c = Cluster(pg, a, b, backend, gateway, root, log_dir)
        yield c
    finally:
        for p in reversed(processes):
            if p is not None:
                p.stop()
        for c in controllers:
            c.stop()
        if saved_password is None:
            os.environ.pop("PGPASSWORD", None)
        else:
            os.environ["PGPASSWORD"] = saved_password
        pg.stop()


def wait_gateway_linked(c: Cluster, *controllers: ClusterController) -> None:
    """Until the gateway has logged a link to each of `controllers` (slot 0 of each logs at info)."""
    deadline = time.monotonic() + LINK_BOUND_S
    while time.monotonic() < deadline:
        log = c.gateway.full_log()
        if all(f"controller={x.address}" in log for x in controllers):
            return
        time.sleep(0.05)
    pytest.fail(f"the gateway did not link to {[x.address for x in controllers]} within {LINK_BOUND_S:.0f} s:\n"
                f"{c.gateway.logs()}", pytrace=False)


def sessions_of(controller: ClusterController, admin: str, device: str) -> list[dict]:
    """The device's live sessions that `controller` relays, as `admin sessions` lists them. The admin file's own
    controller may be either one: the command asks every controller and names each session's."""
    r = controller.cli("admin", "sessions", "--identity", admin, "--json")
    assert r.returncode == 0, r.describe()
    return [s for s in json.loads(r.stdout) if s["device"] == device and s.get("controller") == controller.address]


def refused_without_reaching_backend(c: Cluster, f: Faulty, fence: Faulty) -> None:
    """The device's next request is refused with 403, and the backend never sees it: its probe is not logged once a
    later request of `fence`, a device still allowed, is (that request, not a clock, bounds the wait)."""
    probe = f"probe-{uuid.uuid4().hex}"
    with f.client(timeout=STREAM_END_BOUND_S) as client:
        try:
            r = client.get("/debug/headers", params={"probe": probe})
            outcome = f"HTTP {r.status_code}: {r.text[:300]!r}"
        except httpx.HTTPError as e:
            outcome = repr(e)
    assert outcome.startswith("HTTP 403"), f"the revoked device's request was not refused with 403: {outcome}"
    after = f"probe-{uuid.uuid4().hex}"
    with fence.client() as client:
        assert client.get("/debug/headers", params={"probe": after}).status_code == 200
    assert wait_for_backend_log(c.backend, after), "the backend access log does not show requests"
    assert probe not in c.backend.full_log(), "the revoked device's request reached the backend"


# ------------------------------------------------------------------------------------------------------------------
# A revocation through one controller cuts the device on the other
# ------------------------------------------------------------------------------------------------------------------


def test_revocation_through_a_cuts_a_live_stream_on_b(cluster: Cluster) -> None:
    c = cluster
    f = c.device("tab-b", c.b)
    wait_until_flowing(f, 10.0)
    # Positive control for the "did it reach the backend" check below.
    probe = f"probe-{uuid.uuid4().hex}"
    with f.client() as client:
        assert client.get("/debug/headers", params={"probe": probe}).status_code == 200
    assert wait_for_backend_log(c.backend, probe), "the backend access log does not show requests"

    mark = len(c.b.full_log())
    client, response, lines = open_stream(f)
    try:
        assert sessions_of(c.b, "identities/admin-b.json", "tab-b"), "the stream's circuit is not on B"
        assert not sessions_of(c.a, "identities/admin.json", "tab-b"), "the stream's circuit is on A, not B only"
        # Asked through A, the table still shows the circuit B relays, and says it is B's.
        table = c.a.cli("admin", "sessions", "--identity", "identities/admin.json")
        assert table.returncode == 0, table.describe()
        rows = [line for line in table.stdout.splitlines() if line.startswith("tab-b ")]
        assert len(rows) == 1 and rows[0].rstrip().endswith(c.b.address), table.stdout
        # `status` lists both controllers, each accepting the admin, and counts B's live session there.
        status = c.a.cli("status", "--identity", "identities/admin.json", "--json")
        assert status.returncode == 0, status.describe()
        listed = {x["address"]: x for x in json.loads(status.stdout)["controllers"]}
        assert set(listed) == {c.a.address, c.b.address}, status.stdout
        assert all(x["reachable"] and x["accepted"] for x in listed.values()), status.stdout
        assert listed[c.b.address]["sessions"] >= 1, status.stdout
        c.revoke("tab-b", through=c.a)
        took, how = drain_until_end(lines)
    finally:
        response.close()
        client.close()
        f.tunnel.stop()
    print(f"\nstream on B ended {took:.3f} s after `revoke` through A returned ({how})")
    assert took < STREAM_END_BOUND_S, f"the stream on B went on for {took:.1f} s after the revocation through A"
    # B itself heard it through the store's notifications (the gateway alone could have cut the stream).
    c.b.wait_for_log("identity changed in the store", timeout=STREAM_END_BOUND_S, after=mark)
    assert "identity=tab-b" in c.b.full_log()[mark:]
    f.tunnel.start()
    fence = c.device("tab-b-fence", c.b)
    try:
        wait_until_flowing(fence, 10.0)
        refused_without_reaching_backend(c, f, fence)
    finally:
        fence.tunnel.stop()
        f.tunnel.stop()


def test_policy_change_through_a_cuts_a_live_stream_on_b(cluster: Cluster) -> None:
    """Issue 26: a dial policy narrowed through A ends a device's stream relayed by B, and B applies it itself."""
    c = cluster
    f = c.device("tab-pol", c.b)
    wait_until_flowing(f, 10.0)
    mark = len(c.b.full_log())
    client, response, lines = open_stream(f)
    try:
        assert sessions_of(c.b, "identities/admin-b.json", "tab-pol"), "the stream's circuit is not on B"
        r = c.a.cli("admin", "service", "update", "claude-api", "--identity", "identities/admin.json",
                    "--dial", "#ipad")
        assert r.returncode == 0, r.describe()
        took, how = drain_until_end(lines)
    finally:
        response.close()
        client.close()
        f.tunnel.stop()
        restored = c.a.cli("admin", "service", "update", "claude-api", "--identity", "identities/admin.json",
                           "--dial", "role:device")
        assert restored.returncode == 0, restored.describe()
    print(f"\nstream on B ended {took:.3f} s after `service update` through A returned ({how})")
    assert took < STREAM_END_BOUND_S, f"the stream on B went on for {took:.1f} s after the policy change through A"
    c.b.wait_for_log("services changed in the store", timeout=STREAM_END_BOUND_S, after=mark)
    assert "services=claude-api" in c.b.full_log()[mark:]


# ------------------------------------------------------------------------------------------------------------------
# PostgreSQL restarts under a live stream
# ------------------------------------------------------------------------------------------------------------------


def test_postgres_restart_keeps_streams_and_feeds(cluster: Cluster) -> None:
    c = cluster
    flowing = c.device("tab-pg", c.a, c.b)
    victim = c.device("tab-a", c.a)
    try:
        wait_until_flowing(flowing, 10.0)
        wait_until_flowing(victim, 10.0)
        marks = {x.name: len(x.full_log()) for x in (c.a, c.b)}

        n = 40
        client = flowing.client(timeout=STREAM_END_BOUND_S)
        try:
            response = client.send(
                client.build_request("GET", "/claude/stream", params={"n": n, "interval_ms": 100}), stream=True)
            assert response.status_code == 200
            lines = timed_lines(response, deadline_s=30.0)
            before = parse_sse(lines, stop_after=3)
            restart_started = time.time()
            c.pg.restart()
            restarted = time.time()
            after = parse_sse(lines)
        finally:
            client.close()
        print(f"\nPostgreSQL restarted in {restarted - restart_started:.2f} s under the stream")
        events = before + after
        messages = [e for e in events if e.event == "message"]
        assert [e.json["index"] for e in messages] == list(range(n)), f"events lost or out of order: {events}"
        assert all(isinstance(e.json["text"], str) and e.json["text"] for e in messages), events
        assert events[-1].event == "done" and events[-1].json == {"count": n}, events[-1]
        assert any(e.received_at > restarted for e in messages), "no event arrived after the restart"

        # Each controller listens again by itself, then a new request and a revocation work across them.
        for x in (c.a, c.b):
            x.wait_for_log("store notifications resumed", timeout=FEED_BOUND_S, after=marks[x.name])
        assert through_tunnel_ok(flowing)[0], "a new request after the restart failed"

        mark_a = len(c.a.full_log())
        vclient, vresponse, vlines = open_stream(victim)
        try:
            assert sessions_of(c.a, "identities/admin.json", "tab-a"), "the victim's circuit is not on A"
            c.revoke("tab-a", through=c.b)
            took, how = drain_until_end(vlines)
        finally:
            vresponse.close()
            vclient.close()
        print(f"stream on A ended {took:.3f} s after `revoke` through B returned ({how})")
        assert took < STREAM_END_BOUND_S
        c.a.wait_for_log("identity changed in the store", timeout=STREAM_END_BOUND_S, after=mark_a)
        assert "identity=tab-a" in c.a.full_log()[mark_a:]
        refused_without_reaching_backend(c, victim, flowing)
        for x in (c.a, c.b):
            assert pg_fixture.PASSWORD not in x.full_log(), f"controller {x.name} logged the store password"
    finally:
        flowing.tunnel.stop()
        victim.tunnel.stop()


# The token race across controllers is not here: `enroll` dials the token's issuer (`iss`) only, so the CLI cannot
# send one token to two controllers. ClusterOnPostgresTests races one token through two controllers' enrollment
# paths, and the store contract suite 20 store clients, on a real PostgreSQL.


# ------------------------------------------------------------------------------------------------------------------
# A controller dies: streams end, the next request fails over
# ------------------------------------------------------------------------------------------------------------------


def test_controller_killed_mid_stream_resumes_through_the_other(cluster: Cluster) -> None:
    c = cluster
    f = c.device("ipad-ab")  # enrolled through A once B was up: its file lists A, then B
    identity = json.loads(c.identity_file("ipad-ab").read_text())
    assert identity["controllers"] == [c.a.address, c.b.address], identity
    try:
        wait_gateway_linked(c, c.a, c.b)
        wait_until_flowing(f, 10.0)
        mark_b = len(c.b.full_log())
        before = backend_streams(c.backend)
        n = 80
        client, response, lines = open_stream(f, n=n)
        try:
            assert sessions_of(c.a, "identities/admin.json", "ipad-ab"), "the stream's circuit is not on A"
            assert "identity=ipad-ab" not in c.b.full_log()[mark_b:], "the device dialled B before A died"
            assert c.a.process is not None and c.a.process.proc is not None
            c.a.process.proc.send_signal(signal.SIGKILL)
            killed, cut_at = time.monotonic(), time.time()
            # Both halves lose their path with A; the tunnel resumes the circuit through B, where the gateway is
            # linked too, and its client sees a pause: every event once, in order; one backend request, not cancelled.
            pause = read_resumed_stream(lines, n, cut_at)
        finally:
            response.close()
            client.close()
        print(f"\nstream through A resumed through B after SIGKILL of A: longest pause {pause:.3f} s")
        # The resumption is the failover now: the stream's pause is what a request used to wait.
        assert pause <= FAILOVER_BOUND_S, f"the stream paused {pause:.3f} s (> {FAILOVER_BOUND_S} s)"
        after = backend_streams(c.backend)
        assert after["completed"] == before["completed"] + 1, (before, after)
        assert after["disconnected"] == before["disconnected"], (before, after)

        started = time.monotonic()
        ok, outcome = through_tunnel_ok(f, timeout=STREAM_END_BOUND_S)
        answered = time.monotonic() - started
        print(f"next request through the same tunnel: {outcome}, in {answered:.3f} s, "
              f"{time.monotonic() - killed:.3f} s after SIGKILL of A")
        assert ok, f"the next request after A died did not get through B: {outcome}"
        assert answered <= FAILOVER_BOUND_S, f"the next request took {answered:.3f} s (> {FAILOVER_BOUND_S} s)"
        # The request went through B: B logged the device's connection (its line may follow the answer).
        c.b.wait_for_log("device connected identity=ipad-ab", timeout=STREAM_END_BOUND_S, after=mark_b)

        # A is still listed (its heartbeat is under 30 s old) but cannot answer: `admin sessions` through B names it
        # on stderr, still lists what B relays, and exits 69 so a script never takes the part for the whole.
        partial = c.b.cli("admin", "sessions", "--identity", "identities/admin-b.json", "--json")
        assert partial.returncode == 69, partial.describe()
        assert f"controller {c.a.address} did not answer" in partial.stderr, partial.describe()
        assert isinstance(json.loads(partial.stdout), list), partial.describe()
    finally:
        f.tunnel.stop()
        c.a.restart()  # the same state directory and port: the set-up is whole again


def test_identities_made_before_the_replica_learn_it_and_fail_over(cluster: Cluster) -> None:
    """Issue 38, item 4: a device enrolled before B existed learns B from one circuit through A, and the admin file
    that `controller init` wrote learns it from any command; with A SIGKILLed, both go on through B."""
    c = cluster
    early = json.loads(c.identity_file("early").read_text())
    assert early.get("controllers", [early["controller"]]) == [c.a.address], early
    f = Faulty(c.a, c.backend, c.gateway, Tunnel(c.a, "early", c.log_dir), c.log_dir, device="early")
    f.tunnel.start()
    try:
        wait_gateway_linked(c, c.a, c.b)
        # One request, through A (the only controller the file names): its answer names the cluster.
        wait_until_flowing(f, 10.0)
        # The tunnel saves the list off its event loop, after the answer (an atomic rename): the event is the file's.
        def saved() -> Optional[dict]:
            found = json.loads(c.identity_file("early").read_text())
            return found if set(found.get("controllers", [])) == {c.a.address, c.b.address} else None

        learned = wait_until("the tunnel to save the cluster's controller list", saved)
        assert learned["controller"] == c.a.address and learned["certificate"] == early["certificate"]
        assert oct(c.identity_file("early").stat().st_mode & 0o777) == "0o600"
        # The admin file `controller init` wrote, after an admin command through A (`status` writes nothing).
        r = c.a.cli("admin", "identity", "list")
        assert r.returncode == 0, r.describe()
        admin = json.loads((c.root / "identities" / "admin.json").read_text())
        assert admin["controller"] == c.a.address and set(admin["controllers"]) == {c.a.address, c.b.address}, admin

        assert c.a.process is not None and c.a.process.proc is not None
        c.a.process.proc.send_signal(signal.SIGKILL)
        c.a.process.proc.wait()
        mark_b = len(c.b.full_log())
        # The same tunnel, and a new one started from the learned file, reach the backend through B.
        ok, outcome = through_tunnel_ok(f, timeout=STREAM_END_BOUND_S)
        assert ok, f"the running tunnel did not fail over to B: {outcome}"
        f.tunnel.stop()
        f.tunnel = Tunnel(c.a, "early", c.log_dir)
        f.tunnel.start()
        wait_until_flowing(f, 10.0)
        c.b.wait_for_log("device connected identity=early", timeout=STREAM_END_BOUND_S, after=mark_b)  # through B
        # The admin revokes through B with the same file, A first in it and dead.
        enroll_target = "lost-after-failover"
        r = c.b.cli("admin", "identity", "create", "--identity", "identities/admin.json", enroll_target,
                    "--role", "device", "-o", f"identities/{enroll_target}.token")
        assert r.returncode == 0, r.describe()
        r = c.b.cli("admin", "identity", "revoke", "--identity", "identities/admin.json", enroll_target)
        assert r.returncode == 0, f"revoke with the admin file from controller init, A dead\n{r.describe()}"
    finally:
        f.tunnel.stop()
        c.a.restart()
