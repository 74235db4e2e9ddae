"""A minimal device client for the ils overlay, written from docs/protocol.md and docs/identities.md alone (not from
the sources), to check that the documents are enough to open, use, lose and RESUME a circuit.

What it does, and the section of docs/protocol.md each part follows:

- `Identity`: reads an identity file (docs/identities.md, "The identity file").
- `Connection`: TLS 1.3 with the identity certificate to the controller, ALPN `ils-dial/1`, HTTP/2 with the `h2`
  package ("Data plane"; "Liveness": h2 answers PINGs by itself).
- `Connection.open_stream`: a circuit's stream, `CONNECT` with `:authority` the service, optionally `ils-resume`
  ("Circuits"; "Resuming a circuit", "The device resumes" step 1).
- `Circuit.open`: the end-to-end handshake, version 3, offering the resumable suite `0x05` ("End-to-end handshake",
  "Transcript input", "Signatures", "Each side verifies the other itself", "Keys, version 3"; "Identity
  certificates" for the check of the gateway's certificate).
- `Circuit` records: AES-256-GCM records with flags, nonces from the iv, key changes, FINAL, CANCEL and ACK
  ("Inside a circuit", "Records").
- `Circuit` keeping and ACKs ("Resuming a circuit", "Numbering and keeping").
- `Circuit.finish`: FINAL, the ACK of the peer's FINAL, settling, then END_STREAM ("Ending a circuit").
- `Circuit.resume`: the circuit id and resume key, RESUME / RESUMED, sending kept records again ("Resuming a circuit",
  "Secrets", "Messages", "The device resumes").

It is deliberately synchronous and single-threaded: a `Connection` is pumped by whoever waits on it. It is a test
tool, not a product: one circuit at a time per connection is all it is used for.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import os
import socket
import ssl
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional
from urllib.parse import urlsplit

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from cryptography import x509
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import ExtensionOID, NameOID

# ---------------------------------------------------------------------------------------------------------------
# Constants from docs/protocol.md
# ---------------------------------------------------------------------------------------------------------------

FRAME_BODY_MAX = 1 << 20  # "Inside a circuit": body at most 1 MiB
RECORD_PLAINTEXT_MAX = 65_536  # "Inside a circuit": at most 64 KiB of plaintext; a receiver refuses more
RECORD_PLAINTEXT_SENT = 65_515  # what ils puts in one record, so a framed record is exactly 64 KiB
RECORD_OVERHEAD = 17  # "Records": every record adds 17 bytes

SUITE_RESUMABLE = 0x05
SUITE_CANCEL = 0x04
SUITE_GCM_V3 = 0x03

FLAG_DATA, FLAG_FINAL, FLAG_CANCEL, FLAG_ACK = 0x00, 0x01, 0x02, 0x04
REKEY_EVERY = 1 << 20  # "Records": after each 2^20 records both sides replace the key

MSG_CLIENT_HELLO, MSG_SERVER_HELLO, MSG_CLIENT_FINISHED = 1, 2, 3
MSG_REFUSAL = 0x7F
MSG_RESUME, MSG_RESUMED = 0x52, 0x53

ACK_AFTER_RECORDS = 16  # "Numbering and keeping": after 16 records or 256 KiB of them
ACK_AFTER_BYTES = 256 * 1024
ACK_AFTER_S = 1.0  # ... and 1 s after any it has not acknowledged
ACK_AFTER_ACKS = 32  # ... and once it has received 32 ACKs since its last one

# "Data plane": what ils sends; recommended for throughput.
H2_STREAM_WINDOW = 1 << 20
H2_CONNECTION_WINDOW = 16 << 20
H2_MAX_FRAME = 131_072

IDENTITY_URN = "urn:ils:identity:"


class ProtocolError(Exception):
    """The peer broke the protocol (a malformed message, a record that does not open, ...): the circuit is over."""


class CircuitRefused(Exception):
    """The relay refused the circuit's stream: a non-200 answer with `ils-error` and `ils-reason` ("Circuits")."""

    def __init__(self, status: int, code: str, reason: str) -> None:
        super().__init__(f"{status} {code}: {reason}")
        self.status, self.code, self.reason = status, code, reason


class GatewayRefused(Exception):
    """The gateway's refusal frame (`0x7F`, reason) instead of ServerHello or RESUMED ("Inside a circuit")."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotResumed(Exception):
    """The circuit could not be resumed ("Resuming a circuit": `not_resumed`, with the refusal's reason)."""

    def __init__(self, reason: str, cause: Optional[Exception] = None) -> None:
        super().__init__(reason)
        self.reason, self.cause = reason, cause


class Cancelled(Exception):
    """The gateway sent the CANCEL record: it cut the answer on purpose; not to be resumed ("Ending a circuit")."""


class PathLost(Exception):
    """The circuit's stream or connection went away without FINAL or CANCEL: the path is lost, the circuit is held
    and may be resumed ("Ending a circuit": "With suite 0x05, a lost path is not an end")."""


# ---------------------------------------------------------------------------------------------------------------
# Small encoders
# ---------------------------------------------------------------------------------------------------------------


def u16var(b: bytes) -> bytes:
    """`var`: a u16 length followed by that many bytes ("End-to-end handshake")."""
    if len(b) > 0xFFFF:
        raise ValueError("var field too long")
    return struct.pack(">H", len(b)) + b


def frame(body: bytes) -> bytes:
    """`u32 length (big-endian) ‖ body` ("Inside a circuit")."""
    if len(body) > FRAME_BODY_MAX:
        raise ValueError("frame body over 1 MiB")
    return struct.pack(">I", len(body)) + body


def hkdf(ikm: bytes, salt: Optional[bytes], info: bytes, length: int) -> bytes:
    """HKDF-SHA256, extract then expand (RFC 5869). "no salt" is `None` (HashLen zero bytes, RFC 5869 §2.2)."""
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


class Reader:
    """Reads the fields of one handshake message; any short field or trailing byte is refused."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise ProtocolError("short field")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def var(self) -> bytes:
        return self.take(struct.unpack(">H", self.take(2))[0])

    def end(self) -> None:
        if self.at != len(self.data):
            raise ProtocolError("trailing bytes")


# ---------------------------------------------------------------------------------------------------------------
# Identity (docs/identities.md, "The identity file"; protocol.md, "Identity certificates")
# ---------------------------------------------------------------------------------------------------------------


def identity_of(cert: x509.Certificate) -> tuple[str, str, str]:
    """(id, name, role) of an identity certificate ("Identity certificates": the first `urn:ils:identity:` URI of
    subjectAltName, CN, OU). Raises ProtocolError if it is not an identity certificate."""
    try:
        san = cert.extensions.get_extension_for_oid(ExtensionOID.SUBJECT_ALTERNATIVE_NAME).value
    except x509.ExtensionNotFound:
        raise ProtocolError("no subjectAltName")
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(IDENTITY_URN)]
    if not uris:
        raise ProtocolError("no urn:ils:identity: URI")
    cn = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ou = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if not cn or not ou or ou[0].value not in ("device", "gateway", "admin"):
        raise ProtocolError("subject lacks CN or a role OU")
    if not isinstance(cert.public_key(), ed25519.Ed25519PublicKey):
        raise ProtocolError("not an Ed25519 key")
    return uris[0][len(IDENTITY_URN):], str(cn[0].value), str(ou[0].value)


def verify_peer(cert_der: bytes, ca: x509.Certificate, role: str) -> x509.Certificate:
    """"Each side verifies the other itself": the certificate parses; its issuer is the CA's subject and the CA's key
    verifies its signature; now is within notBefore..notAfter (both included); it is an identity certificate; then the
    role. Key usage, EKU and basic constraints are not read; revocation is not asked."""
    try:
        cert = x509.load_der_x509_certificate(cert_der)
    except ValueError as e:
        raise ProtocolError(f"peer certificate does not parse: {e}")
    if cert.issuer != ca.subject:
        raise ProtocolError("peer certificate not issued by our CA")
    key = ca.public_key()
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
        else:  # not expected: "signed by the controller CA (ECDSA P-256 with SHA-256)"
            raise ProtocolError("unexpected CA key type")
    except InvalidSignature:
        raise ProtocolError("peer certificate signature does not verify")
    now = datetime.datetime.now(datetime.timezone.utc)
    if not (cert.not_valid_before_utc <= now <= cert.not_valid_after_utc):
        raise ProtocolError("peer certificate outside its validity")
    _, _, peer_role = identity_of(cert)
    if peer_role != role:
        raise ProtocolError(f"peer role {peer_role!r}, wanted {role!r}")
    return cert


@dataclass
class Identity:
    """An identity file (docs/identities.md, "The identity file"): `controller`, `controllers`, `certificate`,
    `caCertificate`, `privateKey` (PKCS#8 PEM, Ed25519) and the `identity` record."""
    path: Path
    controller: str
    controllers: list[str]
    certificate_pem: str
    ca_pem: str
    private_key_pem: str
    record: dict

    @classmethod
    def load(cls, path: Path | str) -> "Identity":
        path = Path(path)
        d = json.loads(path.read_text())
        return cls(path, d["controller"], list(d.get("controllers") or []), d["certificate"], d["caCertificate"],
                   d["privateKey"], d["identity"])

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.certificate_pem.encode())

    @property
    def certificate_der(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.DER)

    @property
    def ca(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.ca_pem.encode())

    @property
    def private_key(self) -> ed25519.Ed25519PrivateKey:
        key = serialization.load_pem_private_key(self.private_key_pem.encode(), password=None)
        assert isinstance(key, ed25519.Ed25519PrivateKey)
        return key

    @property
    def id(self) -> str:
        """The bare id: the part of the certificate's URI after `urn:ils:identity:` (used in the transcript)."""
        return identity_of(self.certificate)[0]

    @property
    def name(self) -> str:
        return identity_of(self.certificate)[1]


# ---------------------------------------------------------------------------------------------------------------
# The connection to a controller ("Data plane")
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Stream:
    """One HTTP/2 stream of a `Connection`: the answer's status and headers, the DATA received, and how it ended."""
    conn: "Connection"
    stream_id: int
    status: Optional[int] = None
    headers: dict = field(default_factory=dict)
    inbound: bytearray = field(default_factory=bytearray)
    ended: bool = False  # END_STREAM received
    reset: Optional[int] = None  # RST_STREAM error code received

    @property
    def closed(self) -> bool:
        return self.ended or self.reset is not None or self.conn.dead

    def write(self, data: bytes) -> None:
        self.conn.send_data(self.stream_id, data)

    def read_frame(self, deadline: float) -> bytes:
        """The next circuit frame's body (`u32 length ‖ body`). Raises PathLost if the stream ends first, TimeoutError
        at the deadline."""
        while True:
            if len(self.inbound) >= 4:
                n = struct.unpack(">I", self.inbound[:4])[0]
                if n > FRAME_BODY_MAX:
                    raise ProtocolError(f"frame of {n} bytes")
                if len(self.inbound) >= 4 + n:
                    body = bytes(self.inbound[4:4 + n])
                    del self.inbound[:4 + n]
                    return body
            if self.closed:
                how = "END_STREAM" if self.ended else f"RST_STREAM {self.reset}" if self.reset is not None \
                    else "connection lost"
                raise PathLost(f"stream {self.stream_id}: {how}")
            self.conn.pump(deadline)

    def end(self) -> None:
        self.conn.end_stream(self.stream_id)


class Connection:
    """mTLS (TLS 1.3, the identity certificate, ALPN `ils-dial/1`) and HTTP/2 to a controller ("Data plane").

    The controller is checked against the identity file's CA and the host of the controller URL. The HTTP/2
    settings are the ones the docs recommend for throughput: 1 MiB stream window, 16 MiB connection window, 128 KiB
    frames. h2 answers PINGs itself ("Liveness")."""

    def __init__(self, identity: Identity, controller: Optional[str] = None, timeout: float = 10.0) -> None:
        self.identity = identity
        url = urlsplit(controller or identity.controller)
        host, port = url.hostname, url.port or 443
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3  # "Controller API": TLS 1.3 only
        ctx.load_verify_locations(cadata=identity.ca_pem)
        ctx.check_hostname = True
        ctx.set_alpn_protocols(["ils-dial/1"])
        with tempfile.TemporaryDirectory(prefix="ils-resume-client-") as d:  # ssl loads keys from files only
            cert, key = Path(d) / "cert.pem", Path(d) / "key.pem"
            cert.write_text(identity.certificate_pem)
            key.touch(0o600)
            key.write_text(identity.private_key_pem)
            ctx.load_cert_chain(str(cert), str(key))
        raw = socket.create_connection((host, port), timeout=timeout)
        self.sock = ctx.wrap_socket(raw, server_hostname=host)
        if self.sock.selected_alpn_protocol() != "ils-dial/1":
            raise ProtocolError(f"ALPN {self.sock.selected_alpn_protocol()!r}")
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.h2.local_settings.update({
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: H2_STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: H2_MAX_FRAME,
        })
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(H2_CONNECTION_WINDOW - 65_535)
        self.streams: dict[int, Stream] = {}
        self.dead = False
        self.flush()

    # -- I/O --------------------------------------------------------------------------------------------------------

    def flush(self) -> None:
        out = self.h2.data_to_send()
        if out and not self.dead:
            try:
                self.sock.sendall(out)
            except OSError:
                self._lost()

    def _lost(self) -> None:
        self.dead = True
        try:
            self.sock.close()
        except OSError:
            pass

    def pump(self, deadline: float) -> None:
        """Reads what arrives until the deadline (at most one read) and handles it; raises TimeoutError at the
        deadline. DATA is acknowledged to HTTP/2 at once: "A resumable circuit's path is read as fast as it
        arrives"."""
        if self.dead:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("nothing arrived in time")
        self.sock.settimeout(min(left, 0.2))
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return
        except (OSError, ssl.SSLError):
            self._lost()
            return
        if not data:
            self._lost()
            return
        for event in self.h2.receive_data(data):
            self._handle(event)
        self.flush()

    def _handle(self, event) -> None:
        if isinstance(event, h2.events.ResponseReceived):
            s = self.streams[event.stream_id]
            s.headers = {k.lower(): v for k, v in event.headers}
            s.status = int(s.headers.get(":status", "0"))
        elif isinstance(event, h2.events.DataReceived):
            s = self.streams.get(event.stream_id)
            if s is not None:
                s.inbound += event.data
            self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            if event.stream_id in self.streams:
                self.streams[event.stream_id].ended = True
        elif isinstance(event, h2.events.StreamReset):
            if event.stream_id in self.streams:
                self.streams[event.stream_id].reset = int(event.error_code)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._lost()

    def send_data(self, stream_id: int, data: bytes, timeout: float = 10.0) -> None:
        """Sends DATA within HTTP/2 flow control and the peer's frame size; raises PathLost if the stream is gone."""
        deadline = time.monotonic() + timeout
        view = memoryview(data)
        while view:
            s = self.streams[stream_id]
            if s.reset is not None or self.dead:
                raise PathLost("stream gone while sending")
            window = min(self.h2.local_flow_control_window(stream_id), self.h2.max_outbound_frame_size)
            if window <= 0:
                self.pump(deadline)
                continue
            chunk, view = view[:window], view[window:]
            self.h2.send_data(stream_id, bytes(chunk))
            self.flush()

    def end_stream(self, stream_id: int) -> None:
        if not self.dead:
            try:
                self.h2.end_stream(stream_id)
            except h2.exceptions.ProtocolError:
                pass  # already closed
            self.flush()

    def drop(self) -> None:
        """Closes the TCP connection at once: no TLS close_notify, no GOAWAY, no FINAL or CANCEL; to the controller
        this is a lost connection."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # RST
        except OSError:
            pass
        self._lost()

    def close(self) -> None:
        if not self.dead:
            try:
                self.h2.close_connection()
                self.flush()
            except Exception:
                pass
        self._lost()

    # -- circuits ---------------------------------------------------------------------------------------------------

    def open_stream(self, service: str, extra: Optional[dict[str, str]] = None, timeout: float = 15.0) -> Stream:
        """A circuit's stream: `:method CONNECT`, `:authority <service>` (no `:scheme`, no `:path`, RFC 9113 §8.5),
        plus `extra` headers (`ils-resume`). Waits for the answer; raises CircuitRefused on anything but 200
        ("Circuits"). No DATA is sent before the answer."""
        stream_id = self.h2.get_next_available_stream_id()
        s = Stream(self, stream_id)
        self.streams[stream_id] = s
        headers = [(":method", "CONNECT"), (":authority", service)] + list((extra or {}).items())
        self.h2.send_headers(stream_id, headers)
        self.flush()
        deadline = time.monotonic() + timeout
        while s.status is None:
            if s.closed:
                raise PathLost("stream closed before its answer")
            self.pump(deadline)
        if s.status != 200:
            raise CircuitRefused(s.status, s.headers.get("ils-error", ""), s.headers.get("ils-reason", ""))
        return s


# ---------------------------------------------------------------------------------------------------------------
# Records ("Records": AES-256-GCM, suites 0x03/0x04/0x05)
# ---------------------------------------------------------------------------------------------------------------


class Direction:
    """One direction's record state: key, iv, next record number ("Records"). Record n is sealed under
    K(n div 2^20) with nonce iv XOR (0^4 ‖ u64 n); the iv comes from K0 alone."""

    def __init__(self, key: bytes) -> None:
        self.first_key = key
        self.iv = hkdf(key, None, b"ils-e2e-v3 iv", 12)
        self.keys = [key]
        self.next = 0

    def key(self, n: int) -> bytes:
        while len(self.keys) <= n // REKEY_EVERY:
            self.keys.append(hkdf(self.keys[-1], None, b"ils-e2e-v3 rekey", 32))
        return self.keys[n // REKEY_EVERY]

    def nonce(self, n: int) -> bytes:
        counter = b"\x00\x00\x00\x00" + struct.pack(">Q", n)
        return bytes(a ^ b for a, b in zip(self.iv, counter))

    def seal(self, flags: int, plaintext: bytes) -> bytes:
        n = self.next
        self.next += 1
        return bytes([flags]) + AESGCM(self.key(n)).encrypt(self.nonce(n), plaintext, bytes([flags]))

    def open(self, record: bytes) -> tuple[int, bytes]:
        if len(record) < RECORD_OVERHEAD:
            raise ProtocolError("short record")
        flags, n = record[0], self.next
        try:
            plaintext = AESGCM(self.key(n)).decrypt(self.nonce(n), record[1:], bytes([flags]))
        except InvalidTag:
            raise ProtocolError(f"record {n} does not open")
        if len(plaintext) > RECORD_PLAINTEXT_MAX:
            raise ProtocolError("record over 64 KiB")
        if flags not in (FLAG_DATA, FLAG_FINAL, FLAG_CANCEL, FLAG_ACK):
            raise ProtocolError(f"record flags {flags:#x}")
        if flags == FLAG_CANCEL and plaintext:
            raise ProtocolError("non-empty CANCEL")
        if flags == FLAG_ACK and len(plaintext) != 8:
            raise ProtocolError("ACK not 8 bytes")
        self.next += 1
        return flags, plaintext


# ---------------------------------------------------------------------------------------------------------------
# The circuit: handshake, records, ACKs, ending, resuming
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class Handshake:
    """What the handshake leaves behind: the suite, the gateway's certificate and id, and the direction keys."""
    suite: int
    gateway_cert: x509.Certificate
    gateway_id: str
    device_to_gateway: bytes
    gateway_to_device: bytes


def transcript(parts: list[bytes]) -> bytes:
    """T = SHA-256(I), I = for each part: u32(len p) ‖ p ("Transcript input", version 3)."""
    return hashlib.sha256(b"".join(struct.pack(">I", len(p)) + p for p in parts)).digest()


class Circuit:
    """A resumable circuit (suite 0x05) from the device's side."""

    def __init__(self, identity: Identity, service: str, stream: Stream, hs: Handshake) -> None:
        self.identity, self.service, self.stream, self.hs = identity, service, stream, hs
        self.out = Direction(hs.device_to_gateway)
        self.inn = Direction(hs.gateway_to_device)
        # "Secrets": HKDF(IKM = d→g ‖ g→d, no salt, "ils-e2e-v3 resume", 48): circuit id ‖ resume key.
        secret = hkdf(hs.device_to_gateway + hs.gateway_to_device, None, b"ils-e2e-v3 resume", 48)
        self.circuit_id, self.resume_key = secret[:16], secret[16:]
        # "Numbering and keeping": every sealed record, kept byte for byte until the gateway acknowledges it.
        self.kept: list[tuple[int, bytes]] = []
        self.received = 0  # records of the gateway opened (ACKs included)
        self.acked_up_to = 0  # the c of our last ACK
        self.unacked_records = 0  # records other than ACKs opened since our last ACK
        self.unacked_bytes = 0
        self.first_unacked_at: Optional[float] = None
        self.acks_since_ours = 0
        self.attempt = 0  # "attempt numbers the device's resumptions of this circuit, 1, 2, 3, ..."
        self.peer_final = False
        self.our_final: Optional[int] = None  # the number of our FINAL record
        self.peer_acked = 0  # the highest c the gateway acknowledged
        self.app_data = bytearray()
        self.resumes_sent: list[bytes] = []  # every RESUME message sent, as sent (a relay sees them)

    # -- the handshake ("End-to-end handshake") -------------------------------------------------------------------

    @classmethod
    def open(cls, conn: Connection, service: str, suites: bytes = bytes([SUITE_RESUMABLE]),
             timeout: float = 15.0) -> "Circuit":
        """Opens a circuit's stream and runs the version 3 handshake: ClientHello, ServerHello (or the refusal frame),
        ClientFinished. Offers only `suites` (default: the resumable suite 0x05 alone)."""
        identity = conn.identity
        stream = conn.open_stream(service, timeout=timeout)
        deadline = time.monotonic() + timeout
        eph = X25519PrivateKey.generate()
        eph_pub = eph.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        nonce = os.urandom(32)
        device_der = identity.certificate_der
        hello = (bytes([MSG_CLIENT_HELLO, 3]) + u16var(service.encode()) + u16var(device_der) + eph_pub + nonce
                 + u16var(suites))
        stream.write(frame(hello))

        body = stream.read_frame(deadline)
        if body[:1] == bytes([MSG_REFUSAL]):
            r = Reader(body[1:])
            reason = r.var().decode("utf-8", "replace")
            raise GatewayRefused(reason)
        r = Reader(body)
        if r.u8() != MSG_SERVER_HELLO or r.u8() != 3:
            raise ProtocolError("not a version 3 ServerHello")
        suite = r.u8()
        gateway_der = r.var()
        gw_eph = r.take(32)
        gw_nonce = r.take(32)
        gw_sig = r.take(64)
        r.end()  # H = 0 for suites 0x03-0x05
        if suite not in suites:
            raise ProtocolError(f"suite {suite:#x} was not offered")
        gateway_cert = verify_peer(gateway_der, identity.ca, "gateway")
        gateway_id = identity_of(gateway_cert)[0]
        t = transcript([b"ils-e2e-v3", service.encode(), identity.id.encode(), gateway_id.encode(), device_der,
                        gateway_der, eph_pub, gw_eph, nonce, gw_nonce, suites, bytes([suite])])
        try:
            gateway_cert.public_key().verify(gw_sig, b"responder\n" + t)
        except InvalidSignature:
            raise ProtocolError("gateway's signature does not verify")
        q = eph.exchange(X25519PublicKey.from_public_bytes(gw_eph))
        if q == bytes(32):
            raise ProtocolError("all-zero shared secret")
        d2g = hkdf(q, t, b"ils-e2e-v3 initiator", 32)
        g2d = hkdf(q, t, b"ils-e2e-v3 responder", 32)
        sig = identity.private_key.sign(b"initiator\n" + t)
        stream.write(frame(bytes([MSG_CLIENT_FINISHED]) + sig))
        if suite != SUITE_RESUMABLE:
            raise ProtocolError(f"the gateway agreed suite {suite:#x}, not the resumable 0x05")
        return cls(identity, service, stream, Handshake(suite, gateway_cert, gateway_id, d2g, g2d))

    # -- sending ---------------------------------------------------------------------------------------------------

    def _send_record(self, flags: int, plaintext: bytes) -> int:
        """Seals one record, keeps it ("Numbering and keeping"), and writes it if there is a path. Returns its
        number. A path that is lost while writing is not an error here: the record is kept and sent again."""
        n = self.out.next
        record = self.out.seal(flags, plaintext)
        self.kept.append((n, record))
        if self.stream is not None and not self.stream.closed:
            try:
                self.stream.write(frame(record))
            except PathLost:
                pass
        return n

    def send(self, data: bytes) -> None:
        """Application bytes, in records of at most 65,515 bytes."""
        for i in range(0, len(data), RECORD_PLAINTEXT_SENT):
            self._send_record(FLAG_DATA, data[i:i + RECORD_PLAINTEXT_SENT])

    def _send_ack(self) -> None:
        """ACK: u64 c, c = the gateway's records we have opened (and handed on). "Records", "Numbering and keeping"."""
        self.acked_up_to = self.received
        self.unacked_records = 0
        self.unacked_bytes = 0
        self.first_unacked_at = None
        self.acks_since_ours = 0
        self._send_record(FLAG_ACK, struct.pack(">Q", self.received))

    def _maybe_ack(self, force: bool = False) -> None:
        if self.received == self.acked_up_to:
            return
        if (force or self.unacked_records >= ACK_AFTER_RECORDS or self.unacked_bytes >= ACK_AFTER_BYTES
                or self.acks_since_ours >= ACK_AFTER_ACKS
                or (self.first_unacked_at is not None and time.monotonic() - self.first_unacked_at >= ACK_AFTER_S)):
            self._send_ack()

    # -- receiving -------------------------------------------------------------------------------------------------

    def _on_record(self, record: bytes) -> None:
        """Opens the gateway's next record and acts on it: data for the application, an ACK (forget what it covers),
        FINAL (acknowledged at once), CANCEL (the gateway's decision: not to be resumed)."""
        if self.peer_final:
            # "nothing else may follow FINAL" — except ACKs.
            flags, plaintext = self.inn.open(record)
            if flags != FLAG_ACK:
                raise ProtocolError("a record after FINAL")
        else:
            flags, plaintext = self.inn.open(record)
        self.received += 1
        if flags != FLAG_ACK:
            # The 16-record, 256 KiB and 1 s triggers count the records handed to the application, not the peer's
            # ACKs: those have their own trigger (32 of them), and an ACK answered after 1 s would be answered by an
            # ACK after 1 s, and so on for ever.
            self.unacked_records += 1
            if self.first_unacked_at is None:
                self.first_unacked_at = time.monotonic()
        if flags == FLAG_DATA:
            self.app_data += plaintext
            self.unacked_bytes += len(plaintext)
        elif flags == FLAG_ACK:
            c = struct.unpack(">Q", plaintext)[0]
            c = min(c, self.out.next)  # "a c above the records sent so far counts as all of them"
            self.peer_acked = max(self.peer_acked, c)
            self.kept = [(n, r) for n, r in self.kept if n >= c]
            self.acks_since_ours += 1
        elif flags == FLAG_FINAL:
            self.peer_final = True
            self._maybe_ack(force=True)  # "acknowledges the peer's FINAL ... as soon as it opens the FINAL"
            return
        elif flags == FLAG_CANCEL:
            raise Cancelled("the gateway cancelled the circuit")
        self._maybe_ack()

    def poll(self, timeout: float) -> None:
        """Reads and handles every whole record that arrives within `timeout` (at least one try). Raises PathLost when
        the path is lost, ProtocolError on a bad record."""
        deadline = time.monotonic() + timeout
        if self.stream is None:
            raise PathLost("no path")
        while True:
            try:
                body = self.stream.read_frame(min(deadline, time.monotonic() + 0.2))
            except TimeoutError:
                self._maybe_ack()
                if time.monotonic() >= deadline:
                    return
                continue
            self._on_record(body)
            if time.monotonic() >= deadline or self.settled:
                return

    def read(self, timeout: float = 10.0) -> bytes:
        """Waits until application bytes are available (or FINAL), returns and clears them."""
        deadline = time.monotonic() + timeout
        while not self.app_data and not self.peer_final:
            if time.monotonic() >= deadline:
                raise TimeoutError("no application data in time")
            self.poll(min(0.2, deadline - time.monotonic()))
        out = bytes(self.app_data)
        self.app_data.clear()
        return out

    # -- ending ("Ending a circuit") --------------------------------------------------------------------------------

    @property
    def settled(self) -> bool:
        """Opened the peer's FINAL, and the peer acknowledged a count above our FINAL's number."""
        return self.peer_final and self.our_final is not None and self.peer_acked > self.our_final

    def end_direction(self) -> None:
        """Our FINAL (empty): we send nothing more, but still read the answer (a half-close)."""
        if self.our_final is None:
            self.our_final = self._send_record(FLAG_FINAL, b"")

    def finish(self, timeout: float = 10.0) -> None:
        """Our FINAL (if not sent yet), then keep acknowledging until settled, then END_STREAM: "With suite 0x05
        END_STREAM waits ... until the circuit is settled at that end"."""
        self.end_direction()
        deadline = time.monotonic() + timeout
        while not self.settled:
            if time.monotonic() >= deadline:
                raise TimeoutError("the circuit did not settle")
            self.poll(0.2)
        self.stream.end()

    # -- losing and resuming ("Resuming a circuit") -----------------------------------------------------------------

    def drop_path(self) -> None:
        """Loses the path: the whole connection is closed at once, without FINAL or CANCEL."""
        if self.stream is not None:
            self.stream.conn.drop()
        self.stream = None

    def resume_message(self, attempt: int, received: Optional[int] = None) -> bytes:
        """RESUME: u8 0x52, u8 1, 16 circuit id, u32 attempt, u64 received, 32 tag; tag = HMAC-SHA256(resume key,
        "ils-resume request\\n" ‖ the bytes before it) ("Messages")."""
        body = bytes([MSG_RESUME, 1]) + self.circuit_id + struct.pack(">IQ", attempt,
                                                                      self.received if received is None else received)
        return body + hmac.new(self.resume_key, b"ils-resume request\n" + body, hashlib.sha256).digest()

    def _check_resumed(self, body: bytes, attempt: int) -> int:
        """RESUMED must be of kind 0x53, version 1, this circuit's id and this attempt, and verify. Returns its
        `received`."""
        if len(body) != 1 + 1 + 16 + 4 + 8 + 32:
            raise ProtocolError("RESUMED of the wrong size")
        kind, version, cid = body[0], body[1], body[2:18]
        got_attempt, received = struct.unpack(">IQ", body[18:30])
        tag = hmac.new(self.resume_key, b"ils-resume answer\n" + body[:30], hashlib.sha256).digest()
        if kind != MSG_RESUMED or version != 1 or cid != self.circuit_id or got_attempt != attempt \
                or not hmac.compare_digest(tag, body[30:]):
            raise ProtocolError("RESUMED does not verify")
        return received

    def resume(self, conn_factory, window: float = 60.0, timeout: float = 15.0) -> int:
        """"The device resumes": a new stream (CONNECT, `:authority` the service, `ils-resume: <gateway id>`) on a
        connection from `conn_factory()`; RESUME for the next attempt with our `received`; RESUMED or the refusal
        frame; then every kept record from the gateway's `received` on. Refusals of the relay other than dial_denied,
        identity_blocked and unknown_service, an unreachable controller, or a stream lost before the answer are
        tried again (100 ms doubling to 2 s) within `window`. Returns the attempt that succeeded; raises NotResumed."""
        self.drop_path()
        started = time.monotonic()
        backoff = 0.1
        while True:
            self.attempt += 1
            attempt = self.attempt
            try:
                conn = conn_factory()
                stream = conn.open_stream(self.service, {"ils-resume": self.hs.gateway_id}, timeout=timeout)
                message = self.resume_message(attempt)
                self.resumes_sent.append(message)
                stream.write(frame(message))
                body = stream.read_frame(time.monotonic() + timeout)
            except CircuitRefused as e:
                if e.code in ("dial_denied", "identity_blocked", "unknown_service", "no_such_gateway"):
                    raise NotResumed(e.code, e)
                retry_reason: Exception = e
            except (PathLost, OSError, TimeoutError) as e:
                retry_reason = e
            else:
                if body[:1] == bytes([MSG_REFUSAL]):
                    reason = Reader(body[1:]).var().decode("utf-8", "replace")
                    conn.close()
                    raise NotResumed(reason, GatewayRefused(reason))
                gateway_received = self._check_resumed(body, attempt)
                if self.kept and gateway_received < self.kept[0][0]:
                    raise ProtocolError("the gateway asks for records we no longer keep")
                self.stream = stream
                # Everything the gateway has opened counts as acknowledged; send the rest again, byte for byte.
                self.kept = [(n, r) for n, r in self.kept if n >= gateway_received]
                self.peer_acked = max(self.peer_acked, gateway_received)
                for _, record in self.kept:
                    stream.write(frame(record))
                return attempt
            if time.monotonic() - started + backoff > window:
                raise NotResumed("the grace window ran out", retry_reason)
            time.sleep(backoff)  # the retry backoff the docs describe (ils: 100 ms, doubling to 2 s)
            backoff = min(backoff * 2, 2.0)


@dataclass
class ResumeAnswer:
    """What the gateway answered a RESUME sent by `send_resume`: `kind` is "refused" (the refusal frame; `reason`),
    "resumed" (any other first frame; `body`) or "closed" (the stream ended without a frame); `after` is every byte
    that came after the first frame, and `ended` how the stream ended ("END_STREAM", "RST_STREAM <code>", "connection
    lost", or "open" if it was still open after `linger` seconds)."""
    kind: str
    reason: str = ""
    body: bytes = b""
    after: bytes = b""
    ended: str = "open"


def send_resume(conn: Connection, service: str, gateway_id: str, message: bytes, timeout: float = 15.0,
                linger: float = 2.0) -> ResumeAnswer:
    """Sends one RESUME message as it is (for instance one captured from another device) on a new stream and returns
    the gateway's answer ("The gateway answers": the refusal frame, after which "the stream then closes"). Raises
    CircuitRefused if the relay refuses the stream. Waits up to `linger` s after the first frame for the stream to
    end, to see that nothing else comes."""
    stream = conn.open_stream(service, {"ils-resume": gateway_id}, timeout=timeout)
    stream.write(frame(message))
    try:
        body = stream.read_frame(time.monotonic() + timeout)
    except PathLost:
        answer = ResumeAnswer("closed")
    else:
        if body[:1] == bytes([MSG_REFUSAL]):
            answer = ResumeAnswer("refused", reason=Reader(body[1:]).var().decode("utf-8", "replace"))
        else:
            answer = ResumeAnswer("resumed", body=body)
    deadline = time.monotonic() + linger
    while not stream.closed and time.monotonic() < deadline:
        try:
            conn.pump(deadline)
        except TimeoutError:
            break
    answer.after = bytes(stream.inbound)
    stream.inbound.clear()
    answer.ended = ("END_STREAM" if stream.ended else f"RST_STREAM {stream.reset}" if stream.reset is not None
                    else "connection lost" if conn.dead else "open")
    return answer


# ---------------------------------------------------------------------------------------------------------------
# HTTP/1.1 inside the circuit, and SSE
# ---------------------------------------------------------------------------------------------------------------


class HTTPResponseReader:
    """Parses an HTTP/1.1 response (head, then a chunked or Content-Length body) from bytes fed in any split, and
    hands out the body as it arrives ("Inside a circuit": record boundaries carry no meaning)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.status: Optional[int] = None
        self.headers: dict[str, str] = {}
        self.body = bytearray()
        self.complete = False
        self._chunked = False
        self._left: Optional[int] = None

    def feed(self, data: bytes) -> None:
        self.buf += data
        if self.status is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1").split("\r\n")
            del self.buf[:end + 4]
            self.status = int(head[0].split()[1])
            for line in head[1:]:
                k, _, v = line.partition(":")
                self.headers[k.strip().lower()] = v.strip()
            self._chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
            if not self._chunked and "content-length" in self.headers:
                self._left = int(self.headers["content-length"])
        if self._chunked:
            while not self.complete:
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return
                size = int(self.buf[:end].split(b";")[0], 16)
                if len(self.buf) < end + 2 + size + 2:
                    return
                self.body += self.buf[end + 2:end + 2 + size]
                del self.buf[:end + 2 + size + 2]
                if size == 0:
                    self.complete = True
        elif self._left is not None:
            take = self.buf[:self._left]
            self.body += take
            del self.buf[:len(take)]
            self._left -= len(take)
            self.complete = self._left == 0
        else:
            self.body += self.buf
            self.buf.clear()


def sse_events(body: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """The whole events in `body` as (event, data), and the bytes of an incomplete last one. (Apart from the tests'
    sse_helpers on purpose: this client is written from the docs and stands alone.)"""
    text = body.replace(b"\r\n", b"\n")
    events = []
    *whole, rest = text.split(b"\n\n")
    for block in whole:
        name, data = "message", []
        for line in block.decode().split("\n"):
            if not line or line.startswith(":"):
                continue
            key, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if key == "event":
                name = value
            elif key == "data":
                data.append(value)
        if data:
            events.append((name, "\n".join(data)))
    return events, rest


def get_request(path: str, host: str, close: bool = False) -> bytes:
    """One HTTP/1.1 GET with exactly one Host ("Host inside a circuit"). With `close`, `Connection: close`, so the
    gateway ends the circuit with FINAL right after the answer ("Ending a circuit", "The gateway"); without it the
    device ends the circuit itself once the answer is complete (`Circuit.finish`), and the gateway answers with its
    FINAL at once."""
    connection = "Connection: close\r\n" if close else ""
    return f"GET {path} HTTP/1.1\r\nHost: {host}\r\n{connection}Accept: text/event-stream\r\n\r\n".encode()


class SSEStream:
    """An SSE answer to one GET over a circuit, read event by event; it carries on across resumptions because it
    reads through the `Circuit`, not a stream."""

    def __init__(self, circuit: Circuit, path: str, host: str, close: bool = False) -> None:
        self.circuit = circuit
        self.response = HTTPResponseReader()
        self.events: list[tuple[str, str]] = []
        self._rest = b""
        circuit.send(get_request(path, host, close))

    def _take(self, timeout: float) -> None:
        before = len(self.response.body)
        self.response.feed(self.circuit.read(timeout))
        events, self._rest = sse_events(self._rest + bytes(self.response.body[before:]))
        self.events += events

    def read_events(self, count: int, timeout: float = 20.0) -> list[tuple[str, str]]:
        """Reads until at least `count` events arrived in all; returns every event so far."""
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            if self.response.complete or self.circuit.peer_final:
                raise ProtocolError(f"the answer ended after {len(self.events)} events")
            self._take(max(0.01, deadline - time.monotonic()))
        return self.events

    def read_to_end(self, timeout: float = 30.0) -> list[tuple[str, str]]:
        """Reads until the HTTP response is complete; returns every event."""
        deadline = time.monotonic() + timeout
        while not self.response.complete:
            if self.circuit.peer_final and not self.circuit.app_data:
                raise ProtocolError("the gateway ended the circuit before the answer was complete")
            self._take(max(0.01, deadline - time.monotonic()))
        return self.events
