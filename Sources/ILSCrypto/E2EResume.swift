package import Crypto
public import ILSCore

/// What lets the two ends of a suite-5 circuit find and prove it again on a new path, derived from the handshake's
/// keys (docs/protocol.md, "Resuming a circuit"):
///
/// `HKDF-SHA256(ikm = key(initiator→responder) ‖ key(responder→initiator), salt = empty, info = "ils-e2e-v3 resume",
/// L = 48)`: the first 16 bytes are the circuit's id, the last 32 the key that authenticates its resume messages.
///
/// Both come from the X25519 secret through the signed transcript, so only the two ends know them: not the relay,
/// which sees the id (it is sent in the clear inside the TLS to each hop) but cannot make a message the other end
/// accepts.
public struct E2EResumeSecrets: Sendable {
    public let circuitID: [UInt8]
    let key: SymmetricKey

    public static let idLength = 16

    package init(keys: E2EDirectionKeys) {
        let material = HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: keys.initiatorToResponder + keys.responderToInitiator),
            info: Array("ils-e2e-v3 resume".utf8),
            outputByteCount: 48
        ).withUnsafeBytes { Array($0) }
        circuitID = Array(material[..<Self.idLength])
        key = SymmetricKey(data: material[Self.idLength...])
    }
}

/// The first frame on a path that resumes a circuit (RESUME, from the device), and the gateway's answer (RESUMED):
///
/// ```
/// u8 type (0x52 RESUME, 0x53 RESUMED) ‖ u8 version (1) ‖ circuit id (16) ‖ u32 attempt ‖ u64 received ‖ tag (32)
/// tag = HMAC-SHA256(resume key, "ils-resume request\n" or "ils-resume answer\n" ‖ every byte before the tag)
/// ```
///
/// `attempt` counts the device's resumptions of this circuit, from 1; the gateway accepts only one above the last it
/// accepted, so a message seen once (by a relay, or replayed by anyone) cannot resume the circuit again. The answer
/// repeats the attempt it answers. `received` is how many of the other end's records this end has opened: the other
/// end sends again every record from that one on.
public struct E2EResumeMessage: Sendable, Equatable {
    public enum Kind: UInt8, Sendable {
        case request = 0x52
        case answer = 0x53

        var label: String { self == .request ? "ils-resume request\n" : "ils-resume answer\n" }
    }

    public static let version: UInt8 = 1
    public static let length = 1 + 1 + E2EResumeSecrets.idLength + 4 + 8 + 32

    public let kind: Kind
    public let circuitID: [UInt8]
    public let attempt: UInt32
    public let received: UInt64
    /// The message as it came, for `verify`; empty for one made here.
    private let bytes: [UInt8]

    public init(kind: Kind, circuitID: [UInt8], attempt: UInt32, received: UInt64) {
        precondition(circuitID.count == E2EResumeSecrets.idLength)
        self.kind = kind
        self.circuitID = circuitID
        self.attempt = attempt
        self.received = received
        self.bytes = []
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.kind == rhs.kind && lhs.circuitID == rhs.circuitID && lhs.attempt == rhs.attempt
            && lhs.received == rhs.received
    }

    private var body: [UInt8] {
        var out = [kind.rawValue, Self.version] + circuitID
        withUnsafeBytes(of: attempt.bigEndian) { out += $0 }
        withUnsafeBytes(of: received.bigEndian) { out += $0 }
        return out
    }

    /// The message, authenticated with `secrets` (whose id it must carry).
    public func sealed(with secrets: E2EResumeSecrets) -> [UInt8] {
        precondition(secrets.circuitID == circuitID)
        let body = self.body
        return body + Array(HMAC<SHA256>.authenticationCode(for: Array(kind.label.utf8) + body, using: secrets.key))
    }

    /// Reads a message's fields without checking its tag (the id says whose key checks it: `verify`). Throws for
    /// anything that is not a whole message of this version.
    public static func parse(_ message: [UInt8]) throws(ILSError) -> E2EResumeMessage {
        guard message.count == length, let kind = Kind(rawValue: message[0]), message[1] == version else {
            throw ILSError(.invalidInput, "not a resume message of version \(version)")
        }
        let id = Array(message[2..<18])
        let attempt = message[18..<22].reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        let received = message[22..<30].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        return E2EResumeMessage(kind: kind, circuitID: id, attempt: attempt, received: received, bytes: message)
    }

    private init(kind: Kind, circuitID: [UInt8], attempt: UInt32, received: UInt64, bytes: [UInt8]) {
        self.kind = kind
        self.circuitID = circuitID
        self.attempt = attempt
        self.received = received
        self.bytes = bytes
    }

    /// Whether a parsed message was made with `secrets` (in constant time).
    public func verify(with secrets: E2EResumeSecrets) -> Bool {
        guard bytes.count == Self.length, secrets.circuitID == circuitID else { return false }
        return HMAC<SHA256>.isValidAuthenticationCode(
            bytes[(Self.length - 32)...],
            authenticating: Array(kind.label.utf8) + bytes[..<(Self.length - 32)],
            using: secrets.key
        )
    }
}
