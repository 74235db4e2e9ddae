"""End-to-end tests of the controller, identity and enrollment CLI of the real binary.

One controller per module (the `controller` fixture in conftest.py): `controller init` in a temporary directory, then
`controller run --listen 127.0.0.1:PORT`. Every CLI command runs with that directory as its working directory, so
identities/ lands there and "nothing was written" can be checked by comparing the directory tree before and after.

Each refusal is checked three ways: the exit code of the contract, one line on stderr starting with "ils-gateway: ",
and no file written (nor any other change in the working directory). Where a refusal could be mistaken for a token
that was already broken or spent, the untouched token is enrolled afterwards to show the refusal came from the change.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from conftest import CLI_TIMEOUT_S, CLIResult, Controller

pytestmark = pytest.mark.e2e

# Exit codes of the contract.
EX_OK = 0
EX_BAD_ARGUMENT = 64
EX_NOT_FOUND = 67
EX_UNAVAILABLE = 69
EX_PERMISSION = 77
EX_CONFLICT = 79
TOKEN_MALFORMED = 80
TOKEN_ALGORITHM = 81
TOKEN_SIGNATURE = 82
TOKEN_EXPIRED = 83
TOKEN_USED = 84
TOKEN_UNKNOWN = 85
TOKEN_ISSUER = 86
TOKEN_CA_MISMATCH = 87

ENROLL_TIME_BOUND_S = 5.0  # generous; the product target is well under a second
TOKEN_FIELDS = {"iss", "sub", "jti", "iat", "exp", "ils_ca", "ils_name", "ils_role"}
LIST_FIELDS = {"id", "name", "role", "state", "attributes", "createdAt",
               "certificateFingerprint", "certificateNotAfter", "lastSeenAt"}


# ------------------------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------------------------


def file_mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def b64url_decode(segment: str) -> bytes:
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))


def b64url_encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode_token(token: str) -> tuple[dict, dict, bytes]:
    header, payload, signature = token.split(".")
    return json.loads(b64url_decode(header)), json.loads(b64url_decode(payload)), b64url_decode(signature)


def with_payload(token: str, **changes) -> str:
    """The token with its payload JSON changed and re-encoded (valid base64url), the original signature kept."""
    header, payload, signature = token.split(".")
    claims = json.loads(b64url_decode(payload))
    claims.update(changes)
    forged = b64url_encode(json.dumps(claims, separators=(",", ":")).encode())
    assert forged != payload
    return f"{header}.{forged}.{signature}"


def tree(root: Path, skip: tuple[str, ...] = ("state",)) -> dict[str, tuple]:
    """Every file and directory under root (except the top-level names in skip): size, mtime, mode and content hash."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if here == root:
            dirnames[:] = [d for d in dirnames if d not in skip]
        rel = here.relative_to(root)
        for d in dirnames:
            out[f"{rel / d}/"] = ("dir", file_mode(here / d))
        for f in filenames:
            p = here / f
            st = p.stat()
            out[str(rel / f)] = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode),
                                 hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def assert_unchanged(before: dict[str, tuple], after: dict[str, tuple], what: str) -> None:
    added = sorted(set(after) - set(before))
    removed = sorted(set(before) - set(after))
    changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    assert not (added or removed or changed), (
        f"{what} changed the working directory: added {added}, removed {removed}, changed {changed}"
    )


def assert_error_line(r: CLIResult) -> None:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ils-gateway: "), (
        f"expected exactly one stderr line starting with 'ils-gateway: '\n{r.describe()}"
    )


def assert_refused(r: CLIResult, code: int, what: str) -> None:
    print(f"{what}: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    assert r.returncode == code, f"{what}: expected exit {code}, got {r.returncode}\n{r.describe()}"
    assert_error_line(r)
    assert r.stdout == "", f"{what}: a refusal printed on stdout\n{r.describe()}"


def assert_ok(r: CLIResult, what: str) -> None:
    assert r.returncode == EX_OK, f"{what}: expected exit 0, got {r.returncode}\n{r.describe()}"


def create_token(c: Controller, name: str, *extra: str, role: str = "device") -> Path:
    """`admin identity create NAME --role ROLE -o NAME.jwt`; returns the token file."""
    out = c.root / f"{name}.jwt"
    r = c.cli("admin", "identity", "create", name, "--role", role, *extra, "-o", out.name)
    assert_ok(r, f"creating identity {name}")
    assert out.is_file(), f"{out} was not written\n{r.describe()}"
    return out


def read_token(path: Path) -> str:
    return path.read_text().strip()


def identities(c: Controller) -> dict[str, dict]:
    r = c.cli("admin", "identity", "list", "--json")
    assert_ok(r, "identity list --json")
    data = json.loads(r.stdout)
    assert isinstance(data, list), f"identity list --json is not a JSON array\n{r.describe()}"
    return {entry["name"]: entry for entry in data}


def show(c: Controller, name: str) -> dict:
    r = c.cli("admin", "identity", "show", name, "--json")
    assert_ok(r, f"identity show {name} --json")
    return json.loads(r.stdout)


def read_identity_file(path: Path) -> dict:
    return json.loads(path.read_text())


def ca_fingerprint(c: Controller) -> str:
    der = ssl.PEM_cert_to_DER_cert((c.state_dir / "ca.pem").read_text())
    return hashlib.sha256(der).hexdigest()


# ------------------------------------------------------------------------------------------------------------------
# The iPad of the contract: created and enrolled once per module, checked by the happy-path test, used by others
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class Enrolled:
    create: CLIResult
    token_path: Path
    token_mode: Optional[int]
    enroll: Optional[CLIResult]
    identity_path: Path

    def require(self) -> None:
        """For tests that only need the iPad enrolled: fail clearly if the happy path itself failed."""
        if self.enroll is None or self.enroll.returncode != 0:
            detail = (self.enroll or self.create).describe()
            pytest.fail(f"precondition: enrolling ipad failed (see test_happy_path_enroll)\n{detail}", pytrace=False)


@pytest.fixture(scope="module")
def ipad(controller: Controller) -> Enrolled:
    create = controller.cli("admin", "identity", "create", "ipad", "--role", "device", "-o", "ipad.jwt")
    token_path = controller.root / "ipad.jwt"
    token_mode = file_mode(token_path) if token_path.exists() else None
    enroll = controller.cli("enroll", "ipad.jwt") if create.returncode == 0 else None
    return Enrolled(create, token_path, token_mode, enroll, controller.root / "identities" / "ipad.json")


# ------------------------------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------------------------------


def test_init_created_the_state(controller: Controller) -> None:
    """`controller init` made the CA, keys, token key, store and admin identity, private files mode 0600."""
    for name in ("ca.pem", "ca.key", "server.pem", "server.key", "token.key", "controller.json", "store.sqlite"):
        assert (controller.state_dir / name).is_file(), f"controller init did not create {name}"
    for name in ("ca.key", "server.key", "token.key", "store.sqlite"):
        mode = file_mode(controller.state_dir / name)
        assert mode == 0o600, f"{name} has mode {oct(mode)}, expected 0o600"
    admin = controller.root / "identities" / "admin.json"
    assert admin.is_file(), "controller init did not write identities/admin.json (relative to its cwd)"
    assert file_mode(admin) == 0o600, f"admin identity has mode {oct(file_mode(admin))}"
    assert read_identity_file(admin)["identity"]["role"] == "admin"


def test_happy_path_enroll(ipad: Enrolled, record_property) -> None:
    assert_ok(ipad.create, "identity create ipad --role device -o ipad.jwt")
    assert ipad.token_mode == 0o600, f"ipad.jwt has mode {oct(ipad.token_mode or 0)}, expected 0o600"
    assert ipad.enroll is not None
    assert_ok(ipad.enroll, "enroll ipad.jwt")
    elapsed = ipad.enroll.elapsed
    print(f"enroll wall time: {elapsed * 1000:.0f} ms")
    record_property("enroll_wall_time_ms", round(elapsed * 1000))
    assert elapsed < ENROLL_TIME_BOUND_S, f"enroll took {elapsed:.2f} s (bound {ENROLL_TIME_BOUND_S} s)"

    assert ipad.identity_path.is_file(), "enroll did not write identities/ipad.json"
    assert file_mode(ipad.identity_path) == 0o600, f"identity file mode {oct(file_mode(ipad.identity_path))}"
    doc = read_identity_file(ipad.identity_path)
    assert doc["identity"]["name"] == "ipad"
    assert doc["identity"]["role"] == "device"
    assert "BEGIN PRIVATE KEY" in doc["privateKey"]
    assert "BEGIN CERTIFICATE" in doc.get("certificate", ""), "identity file has no certificate"
    leftovers = [p.name for p in ipad.identity_path.parent.iterdir() if p.name not in ("admin.json", "ipad.json")]
    assert not leftovers, f"enroll left other files in identities/: {leftovers}"


def test_token_format(controller: Controller, ipad: Enrolled) -> None:
    """A JWS compact string, base64url without padding, EdDSA, with the claims of the contract."""
    token = read_token(ipad.token_path)
    segments = token.split(".")
    assert len(segments) == 3 and all(segments), f"not header.payload.signature: {token[:80]}"
    alphabet = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert all(set(s) <= alphabet for s in segments), "token segments are not unpadded base64url"
    header, claims, signature = decode_token(token)
    assert header == {"alg": "EdDSA", "typ": "JWT"}
    assert TOKEN_FIELDS <= set(claims), f"missing claims: {TOKEN_FIELDS - set(claims)}"
    assert len(signature) == 64, "an Ed25519 signature is 64 bytes"
    assert claims["iss"] == controller.address
    assert claims["ils_name"] == "ipad" and claims["ils_role"] == "device"
    assert claims["ils_ca"] == ca_fingerprint(controller)
    assert claims["exp"] - claims["iat"] == 24 * 3600, "default --expires is 24h"


def test_list_shows_ipad_and_admin_active(controller: Controller, ipad: Enrolled) -> None:
    ipad.require()
    listed = identities(controller)
    print(json.dumps(listed, indent=1))
    for name, role in (("ipad", "device"), ("admin", "admin")):
        assert name in listed, f"{name} missing from identity list: {sorted(listed)}"
        entry = listed[name]
        assert entry["role"] == role and entry["state"] == "active", f"{name}: {entry}"
        assert LIST_FIELDS <= set(entry), f"{name}: missing fields {LIST_FIELDS - set(entry)}"
    doc = read_identity_file(ipad.identity_path)
    assert listed["ipad"]["id"] == doc["identity"]["id"]
    assert listed["ipad"]["certificateFingerprint"] == doc["identity"]["certificateFingerprint"]
    assert listed["ipad"]["id"] == decode_token(read_token(ipad.token_path))[1]["sub"]


def test_reused_token_is_refused(controller: Controller, ipad: Enrolled) -> None:
    ipad.require()
    fingerprint = identities(controller)["ipad"]["certificateFingerprint"]
    before = tree(controller.root)
    r = controller.cli("enroll", "ipad.jwt", "--out", "other.json")
    assert_refused(r, TOKEN_USED, "enroll of a used token")
    assert not (controller.root / "other.json").exists()
    assert_unchanged(before, tree(controller.root), "a refused reuse")
    assert identities(controller)["ipad"]["certificateFingerprint"] == fingerprint, "the refusal changed ipad"


@pytest.mark.parametrize("change", ["ils_name", "exp"])
def test_tampered_payload_is_refused(controller: Controller, change: str) -> None:
    name = f"tamper-{change.replace('_', '-')}"
    token = read_token(create_token(controller, name))
    claims = decode_token(token)[1]
    if change == "ils_name":
        forged = with_payload(token, ils_name=name + "x")
    else:
        forged = with_payload(token, exp=claims["exp"] + 30 * 24 * 3600)
    before = tree(controller.root)
    r = controller.cli("enroll", forged)
    assert_refused(r, TOKEN_SIGNATURE, f"enroll of a token with {change} changed")
    assert_unchanged(before, tree(controller.root), "a refused tampered token")
    # The genuine token still works: the refusal came from the change, and it did not spend the token.
    assert_ok(controller.cli("enroll", token), "enroll of the untouched token after the tampered one")


def test_tampered_signature_is_refused(controller: Controller) -> None:
    token = read_token(create_token(controller, "tamper-sig"))
    header, payload, signature = token.split(".")
    raw = bytearray(b64url_decode(signature))
    raw[len(raw) // 2] ^= 0x01
    forged = f"{header}.{payload}.{b64url_encode(bytes(raw))}"
    before = tree(controller.root)
    r = controller.cli("enroll", forged)
    assert_refused(r, TOKEN_SIGNATURE, "enroll of a token with a flipped signature bit")
    assert_unchanged(before, tree(controller.root), "a refused tampered signature")
    assert_ok(controller.cli("enroll", token), "enroll of the untouched token after the tampered one")


@pytest.mark.parametrize("given_as", ["argument", "file"])
def test_alg_none_is_refused(controller: Controller, given_as: str) -> None:
    """header {"alg":"none"} and an empty signature: `header.payload.` (the unsecured JWS of RFC 7519)."""
    name = f"alg-none-{given_as}"
    token = read_token(create_token(controller, name))
    payload = token.split(".")[1]
    forged = f"{b64url_encode(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{payload}."
    if given_as == "file":
        path = controller.root / f"{name}-forged.jwt"
        path.write_text(forged + "\n")
        arg = path.name
    else:
        arg = forged
    before = tree(controller.root)
    r = controller.cli("enroll", arg)
    assert_refused(r, TOKEN_ALGORITHM, f"enroll of an alg=none token given as {given_as}")
    assert_unchanged(before, tree(controller.root), "a refused alg=none token")
    assert_ok(controller.cli("enroll", token), "enroll of the untouched token after the alg=none one")


def test_garbage_is_refused(controller: Controller) -> None:
    before = tree(controller.root)
    # "not-a-token" may be refused as a malformed token (80) or as neither a token nor a readable file.
    r = controller.cli("enroll", "not-a-token")
    print(f"enroll not-a-token: exit {r.returncode}, stderr {r.stderr.strip()!r}")
    assert r.returncode != 0, r.describe()
    assert_error_line(r)
    # Three segments that are not a JWT: unambiguously a malformed token.
    assert_refused(controller.cli("enroll", "a.b.c"), TOKEN_MALFORMED, "enroll a.b.c")
    assert_unchanged(before, tree(controller.root), "refused garbage")


def test_ca_fingerprint_mismatch_is_refused(controller: Controller) -> None:
    token = read_token(create_token(controller, "wrong-ca"))
    forged = with_payload(token, ils_ca="0" * 64)
    before = tree(controller.root)
    assert_refused(controller.cli("enroll", forged), TOKEN_CA_MISMATCH, "enroll of a token pinning another CA")
    assert_unchanged(before, tree(controller.root), "a refused CA mismatch")


def test_wrong_issuer_is_refused(controller: Controller) -> None:
    """The token names https://localhost:PORT: the same controller answers, but under another address."""
    try:
        if not any(a[4][0] == "127.0.0.1" for a in socket.getaddrinfo("localhost", None, socket.AF_INET)):
            pytest.skip("localhost does not resolve to 127.0.0.1 here")
    except socket.gaierror:
        pytest.skip("localhost does not resolve here")
    token = read_token(create_token(controller, "wrong-iss"))
    forged = with_payload(token, iss=controller.address.replace("127.0.0.1", "localhost"))
    before = tree(controller.root)
    assert_refused(controller.cli("enroll", forged), TOKEN_ISSUER, "enroll of a token naming another issuer")
    assert_unchanged(before, tree(controller.root), "a refused issuer")


@pytest.mark.parametrize("kind", ["used", "tampered"])
def test_refused_enroll_creates_no_directory(controller: Controller, ipad: Enrolled, kind: str) -> None:
    """On a fresh machine identities/ does not exist yet; a refused enroll must not leave it (or any --out
    directory) behind. Checked with a used token (refused by the controller) and a tampered one (refused here)."""
    ipad.require()
    if kind == "used":
        arg, code = ipad.token_path.name, TOKEN_USED
    else:
        token = read_token(create_token(controller, "no-dir"))
        arg, code = with_payload(token, ils_name="no-dirx"), TOKEN_SIGNATURE
    out = f"fresh-{kind}/device.json"
    before = tree(controller.root)
    assert_refused(controller.cli("enroll", arg, "--out", out), code, f"enroll of a {kind} token --out {out}")
    assert_unchanged(before, tree(controller.root), f"a refused enroll of a {kind} token into a new directory")


def test_expired_token_is_refused(controller: Controller) -> None:
    path = create_token(controller, "short-lived", "--expires", "1s")
    # Sleep: the clock must pass the token's expiry; no event stands for time passing.
    time.sleep(2.2)
    before = tree(controller.root)
    r = controller.cli("enroll", path.name)
    assert_refused(r, TOKEN_EXPIRED, "enroll of a token 2 s after its 1 s validity")
    assert_unchanged(before, tree(controller.root), "a refused expired token")
    assert identities(controller)["short-lived"]["state"] == "pending"


def test_concurrent_enrollments_of_one_token(controller: Controller) -> None:
    """Two enroll processes started together with one token: exactly one wins. Three rounds, for a better chance
    of both requests reaching the controller at the same time."""
    for round_ in range(3):
        name = f"race-{round_}"
        token = create_token(controller, name)
        outs = [controller.root / f"{name}-a.json", controller.root / f"{name}-b.json"]
        procs = [controller.popen("enroll", token.name, "--out", out.name) for out in outs]
        results = []
        for p in procs:
            try:
                stdout, stderr = p.communicate(timeout=CLI_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                    q.communicate()
                pytest.fail("a concurrent enroll did not finish in time", pytrace=False)
            results.append(CLIResult(p.args, p.returncode, stdout, stderr, 0.0))
        detail = "\n".join(r.describe() for r in results)
        print(f"round {round_}: exits {[r.returncode for r in results]}")
        assert sorted(r.returncode for r in results) == [EX_OK, TOKEN_USED], detail
        loser = next(r for r in results if r.returncode == TOKEN_USED)
        assert_error_line(loser)
        existing = [out for out in outs if out.exists()]
        assert len(existing) == 1, f"expected exactly one identity file, found {existing}\n{detail}"
        winner = outs[[r.returncode for r in results].index(EX_OK)]
        assert existing == [winner]
        assert file_mode(winner) == 0o600
        assert read_identity_file(winner)["identity"]["certificateFingerprint"] == \
            identities(controller)[name]["certificateFingerprint"]


def test_existing_identity_file_needs_force(controller: Controller) -> None:
    create_token(controller, "laptop")
    assert_ok(controller.cli("enroll", "laptop.jwt"), "enroll laptop.jwt")
    target = controller.root / "identities" / "laptop.json"
    original = read_identity_file(target)

    reissue = controller.cli("admin", "identity", "reissue", "laptop", "-o", "laptop2.jwt")
    assert_ok(reissue, "identity reissue laptop -o laptop2.jwt")
    assert file_mode(controller.root / "laptop2.jwt") == 0o600

    before = tree(controller.root)
    r = controller.cli("enroll", "laptop2.jwt")
    assert_refused(r, EX_CONFLICT, "enroll over an existing identity file without --force")
    assert_unchanged(before, tree(controller.root), "a refused overwrite")

    r = controller.cli("enroll", "laptop2.jwt", "--force")
    assert_ok(r, "enroll laptop2.jwt --force")
    assert file_mode(target) == 0o600
    replaced = read_identity_file(target)
    assert replaced["privateKey"] != original["privateKey"], "--force did not replace the identity file"
    new_fp = replaced["identity"]["certificateFingerprint"]
    assert new_fp != original["identity"]["certificateFingerprint"]
    assert identities(controller)["laptop"]["certificateFingerprint"] == new_fp
    after = tree(controller.root)
    assert set(after) == set(before), f"--force left other files behind: {sorted(set(after) ^ set(before))}"


def test_controller_restart_keeps_identities(controller: Controller) -> None:
    create_token(controller, "used-before-restart")
    assert_ok(controller.cli("enroll", "used-before-restart.jwt"), "enroll before restart")
    create_token(controller, "pending-over-restart")

    def summary() -> dict[str, tuple]:
        return {n: (e["id"], e["role"], e["state"], e.get("certificateFingerprint"))
                for n, e in identities(controller).items()}

    before = summary()
    controller.restart()
    after = summary()
    assert after == before

    # What the store says about tokens survived too: a used one stays used, an outstanding one still works.
    r = controller.cli("enroll", "used-before-restart.jwt", "--out", "used-again.json")
    assert_refused(r, TOKEN_USED, "enroll, after a restart, of a token used before it")
    assert_ok(controller.cli("enroll", "pending-over-restart.jwt"), "enroll after restart of a token made before it")


def test_controller_down_is_unavailable_and_keeps_the_token(controller: Controller) -> None:
    token = create_token(controller, "while-down")
    controller.stop()
    try:
        before = tree(controller.root)
        r = controller.cli("enroll", token.name)
        assert_refused(r, EX_UNAVAILABLE, "enroll while the controller is stopped")
        assert_unchanged(before, tree(controller.root), "an enroll that could not reach the controller")
    finally:
        controller.start()
    assert_ok(controller.cli("enroll", token.name), "enroll once the controller is back")


def test_init_refuses_existing_state_dir(controller: Controller) -> None:
    state_before = tree(controller.state_dir, skip=())
    root_before = tree(controller.root)
    r = controller.init()
    assert_refused(r, EX_CONFLICT, "controller init on an existing state dir")
    r = controller.init("--admin-out", "new-admin.json")
    assert_refused(r, EX_CONFLICT, "controller init --admin-out on an existing state dir")
    assert_unchanged(state_before, tree(controller.state_dir, skip=()), "controller init (state dir)")
    assert_unchanged(root_before, tree(controller.root), "controller init (working dir)")


def test_admin_api_refuses_a_device(controller: Controller, ipad: Enrolled) -> None:
    ipad.require()
    before = tree(controller.root)
    r = controller.cli("admin", "--identity", "identities/ipad.json", "identity", "list")
    assert_refused(r, EX_PERMISSION, "admin identity list with a device identity")
    r = controller.cli("admin", "identity", "list", "--json", "--identity", "identities/ipad.json")
    assert_refused(r, EX_PERMISSION, "admin identity list --identity (after the verb) with a device identity")
    r = controller.cli("admin", "--identity", "identities/ipad.json", "identity", "create", "sneaky", "--role", "admin")
    assert_refused(r, EX_PERMISSION, "admin identity create with a device identity")
    assert_unchanged(before, tree(controller.root), "refused admin calls")
    assert "sneaky" not in identities(controller)


def test_invalid_identity_name_is_refused(controller: Controller) -> None:
    parent = controller.root.parent
    parent_before = {p.name for p in parent.iterdir() if "evil" in p.name}
    before = tree(controller.root)
    r = controller.cli("admin", "identity", "create", "../evil", "--role", "device", "-o", "evil.jwt")
    assert_refused(r, EX_BAD_ARGUMENT, "identity create ../evil")
    assert_unchanged(before, tree(controller.root), "a refused identity name")
    assert {p.name for p in parent.iterdir() if "evil" in p.name} == parent_before, "something was written to .."
    assert not any("evil" in name for name in identities(controller))


def test_reissue_gives_a_new_certificate(controller: Controller, ipad: Enrolled) -> None:
    ipad.require()
    old_file = ipad.identity_path.read_bytes()
    before = show(controller, "ipad")
    r = controller.cli("admin", "identity", "reissue", "ipad", "-o", "ipad2.jwt")
    assert_ok(r, "identity reissue ipad -o ipad2.jwt")
    assert file_mode(controller.root / "ipad2.jwt") == 0o600
    r = controller.cli("enroll", "ipad2.jwt", "--out", "identities/ipad-new.json")
    assert_ok(r, "enroll ipad2.jwt --out identities/ipad-new.json")
    after = show(controller, "ipad")
    print(f"fingerprint before {before.get('certificateFingerprint')}, after {after.get('certificateFingerprint')}")
    assert after["certificateFingerprint"] != before["certificateFingerprint"]
    assert after["id"] == before["id"] and after["state"] == "active"
    new_doc = read_identity_file(controller.root / "identities" / "ipad-new.json")
    assert new_doc["identity"]["certificateFingerprint"] == after["certificateFingerprint"]
    assert ipad.identity_path.read_bytes() == old_file, "enroll --out touched the old identity file"


def test_deleted_identity_token_is_refused(controller: Controller) -> None:
    token = create_token(controller, "doomed")
    assert_ok(controller.cli("admin", "identity", "delete", "doomed"), "identity delete doomed")
    assert "doomed" not in identities(controller)
    assert_refused(controller.cli("admin", "identity", "show", "doomed"), EX_NOT_FOUND, "identity show doomed")
    before = tree(controller.root)
    r = controller.cli("enroll", token.name)
    assert_refused(r, TOKEN_UNKNOWN, "enroll of the token of a deleted identity")
    assert_unchanged(before, tree(controller.root), "a refused token of a deleted identity")


def test_audit_records_creation_enrollment_and_refusal(controller: Controller) -> None:
    started = int(time.time()) - 1
    create_token(controller, "audited")
    assert_ok(controller.cli("enroll", "audited.jwt"), "enroll audited.jwt")
    assert_refused(controller.cli("enroll", "audited.jwt", "--out", "audited-again.json"), TOKEN_USED,
                   "second enroll of audited.jwt")
    r = controller.cli("admin", "audit", "--since", "15m", "--json")
    assert_ok(r, "admin audit --since 15m --json")
    entries = json.loads(r.stdout)
    assert isinstance(entries, list)
    recent = [e for e in entries if e.get("at", 0) >= started]
    print(json.dumps(recent, indent=1))
    actions = {(e.get("action"), e.get("target")) for e in recent}
    assert ("identity.create", "audited") in actions, f"no identity.create for audited in {sorted(actions)}"
    assert ("identity.enroll", "audited") in actions, f"no identity.enroll for audited in {sorted(actions)}"
    assert any(e.get("action") == "enroll.refused" for e in recent), f"no enroll.refused in {sorted(actions)}"
