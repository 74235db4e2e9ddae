import Crypto
import Foundation
public import ILSCore
import SwiftASN1
public import X509

/// The end-to-end handshake between a device (initiator) and a gateway (responder), run over a circuit that the
/// controller relays. docs/protocol.md ("End-to-end handshake") gives the byte layouts.
///
/// Trust assumption: the relay is not trusted. Each side checks the other's certificate against the CA it enrolled
/// with (never against anything the relay says), and each side signs its ephemeral X25519 key together with the
/// whole transcript (service, both identity ids and certificates, both ephemeral keys, both nonces) with its
/// enrolled Ed25519 identity key. A relay that substitutes a key, replays a hello or changes the service breaks a
/// signature, and the circuit fails closed. (OpenZiti's end-to-end keys are not signed by the endpoints; ours are.)
public enum E2EHandshake {
    /// The version a device speaks: 3, the one built on CryptoKit's primitives alone. Gateways answer every version
    /// they were given (`E2EResponder`): 1 and 2 from ILSSodium as well, so devices built before version 3 keep working.
    public static let version: any E2EHandshakeVersion = E2EHandshakeV3()

    /// What both sides need: their own certificate and key, and the CA to judge the peer by.
    public struct Credentials: Sendable {
        public let certificateDER: [UInt8]
        /// The identity id in our own certificate, read once here rather than on every circuit's handshake.
        public let identityID: String
        public let keyPair: IdentityKeyPair
        public let authority: Certificate

        public init(certificatePEM: String, privateKeyPEM: String, caCertificatePEM: String) throws(ILSError) {
            guard let certificate = try? Certificate(pemEncoded: certificatePEM),
                let authority = try? Certificate(pemEncoded: caCertificatePEM)
            else { throw ILSError(.invalidInput, "the identity's certificates are not valid PEM") }
            self.certificateDER = CertificateAuthority.der(certificate)
            self.identityID = try IdentityCertificate(der: certificateDER).id
            self.keyPair = try IdentityKeyPair(privateKeyPEM: privateKeyPEM)
            self.authority = authority
        }
    }

    public enum MessageType: UInt8 {
        case clientHello = 1
        case serverHello = 2
        case clientFinished = 3
        /// Gateway → device instead of ServerHello: `u8 0x7F`, `var reason (UTF-8)`. Unauthenticated by design (it
        /// carries no secret); it only lets a refused device say why.
        case refusal = 0x7F
    }

    /// A refusal message with a reason a person can act on (at most 512 bytes of it).
    public static func refusal(_ reason: String) -> [UInt8] {
        var writer = HandshakeWriter()
        writer.u8(MessageType.refusal.rawValue)
        writer.variable(Array(reason.utf8.prefix(512)))
        return writer.bytes
    }

    /// The reason in a refusal message, or `nil` when the message is something else.
    public static func refusalReason(_ message: [UInt8]) -> String? {
        var reader = HandshakeReader(bytes: message)
        guard (try? reader.u8()) == MessageType.refusal.rawValue, let reason = try? reader.variable() else {
            return nil
        }
        return String(decoding: reason, as: UTF8.self)
    }

    static func failure(_ reason: String) -> ILSError {
        ILSError(.e2eHandshakeFailed, "end-to-end handshake failed: \(reason)")
    }

    /// Checks a peer certificate ourselves: issued by our CA (signature), currently valid, an identity certificate.
    ///
    /// A certificate that passed is remembered (by its bytes and the CA) until it expires, so the circuits a device opens
    /// one after another don't each pay for parsing and an ECDSA verification. Revocation is not this check's job: the
    /// gateway's block list and the relay's store check run on every circuit.
    static func verifyPeer(_ der: [UInt8], authority: Certificate, now: Date) throws(ILSError) -> IdentityCertificate {
        if let known = VerifiedCertificates.shared.lookup(der, authority: authority, now: now) { return known }
        let (verified, validity) = try verifyUncached(der, authority: authority, now: now)
        VerifiedCertificates.shared.remember(der, authority: authority, verified: verified, validity: validity)
        return verified
    }

    private static func verifyUncached(
        _ der: [UInt8],
        authority: Certificate,
        now: Date
    ) throws(ILSError) -> (IdentityCertificate, ClosedRange<Date>) {
        guard let certificate = try? Certificate(derEncoded: der) else { throw failure("peer certificate unreadable") }
        guard certificate.issuer == authority.subject,
            authority.publicKey.isValidSignature(certificate.signature, for: certificate)
        else { throw failure("peer certificate is not issued by our controller's CA") }
        guard certificate.notValidBefore <= now, now <= certificate.notValidAfter else {
            throw failure("peer certificate is expired or not yet valid")
        }
        return (try IdentityCertificate(der: der), certificate.notValidBefore...certificate.notValidAfter)
    }

    /// What every version hashes into its transcript: the label `ils-e2e-vN` and then each part, each preceded by its
    /// length as a big-endian u32, so no two transcripts share an encoding and a transcript of one version is never
    /// one of another.
    package static func transcriptInput(version: UInt8, _ parts: [[UInt8]]) -> [UInt8] {
        var input: [UInt8] = []
        for part in [Array("ils-e2e-v\(version)".utf8)] + parts {
            let length = UInt32(part.count)
            input += [UInt8(length >> 24), UInt8(length >> 16 & 0xFF), UInt8(length >> 8 & 0xFF), UInt8(length & 0xFF)]
            input += part
        }
        return input
    }

    /// An X25519 public key's length (RFC 7748), in every version.
    static let ephemeralKeyLength = 32

    /// X25519 of our ephemeral key and the peer's (RFC 7748 §6.1), or `nil` for a peer key that is not 32 bytes or
    /// gives the all-zero secret (a low-order point: the peer would learn nothing from it, and neither would we).
    static func sharedSecret(
        _ ours: Curve25519.KeyAgreement.PrivateKey,
        _ peer: [UInt8]
    ) -> SharedSecret? {
        guard let peerKey = try? Curve25519.KeyAgreement.PublicKey(rawRepresentation: peer),
            let shared = try? ours.sharedSecretFromKeyAgreement(with: peerKey),
            shared.withUnsafeBytes({ $0.contains { $0 != 0 } })
        else { return nil }
        return shared
    }

    static func signed(_ role: String, _ transcript: [UInt8]) -> [UInt8] {
        Array("\(role)\n".utf8) + transcript
    }
}

/// The two directions of an established circuit.
public struct E2ESession {
    public let sender: E2ERecordSender
    public let receiver: E2ERecordReceiver
    /// The verified identity at the other end.
    public let peer: IdentityCertificate
    public let service: String
    public var suite: E2ESuite { sender.suite }
    /// What resumes the circuit on a new path: only with a resumable suite (5).
    public let resume: E2EResumeSecrets?

    /// A session from keys agreed elsewhere; the handshake makes the real ones. The fuzz targets use a fixed one.
    package init(
        sender: E2ERecordSender,
        receiver: E2ERecordReceiver,
        peer: IdentityCertificate,
        service: String,
        resume: E2EResumeSecrets? = nil
    ) {
        self.sender = sender
        self.receiver = receiver
        self.peer = peer
        self.service = service
        self.resume = resume
    }
}

/// Reads and writes the handshake messages' fields.
struct HandshakeWriter {
    var bytes: [UInt8] = []
    mutating func u8(_ value: UInt8) { bytes.append(value) }
    mutating func fixed(_ value: [UInt8]) { bytes += value }
    mutating func variable(_ value: [UInt8]) {
        bytes.append(UInt8(value.count >> 8))
        bytes.append(UInt8(value.count & 0xFF))
        bytes += value
    }
}

struct HandshakeReader {
    let bytes: [UInt8]
    var offset = 0

    mutating func u8() throws(ILSError) -> UInt8 {
        guard offset < bytes.count else { throw E2EHandshake.failure("message truncated") }
        defer { offset += 1 }
        return bytes[offset]
    }

    mutating func fixed(_ count: Int) throws(ILSError) -> [UInt8] {
        guard bytes.count - offset >= count else { throw E2EHandshake.failure("message truncated") }
        defer { offset += count }
        return Array(bytes[offset..<(offset + count)])
    }

    mutating func variable() throws(ILSError) -> [UInt8] {
        let count = Int(try u8()) << 8 | Int(try u8())
        return try fixed(count)
    }

    func end() throws(ILSError) {
        guard offset == bytes.count else { throw E2EHandshake.failure("message has trailing bytes") }
    }
}

/// Peer certificates that passed `E2EHandshake.verifyPeer`, keyed by their DER and the CA they were checked against.
/// Bounded: when full it starts over (a process talks to a handful of peers; a flood of distinct certificates only
/// costs what it would without the cache).
final class VerifiedCertificates: @unchecked Sendable {
    static let shared = VerifiedCertificates()
    static let capacity = 1024

    private struct Key: Hashable {
        let certificate: [UInt8]
        let authority: Certificate
    }

    // @unchecked: `entries` is only touched while `lock` is held.
    private let lock = NSLock()
    private var entries: [Key: (IdentityCertificate, ClosedRange<Date>)] = [:]

    func lookup(_ der: [UInt8], authority: Certificate, now: Date) -> IdentityCertificate? {
        let key = Key(certificate: der, authority: authority)
        guard let (found, validity) = lock.withLock({ entries[key] }), validity.contains(now) else { return nil }
        return found
    }

    func remember(
        _ der: [UInt8],
        authority: Certificate,
        verified: IdentityCertificate,
        validity: ClosedRange<Date>
    ) {
        let key = Key(certificate: der, authority: authority)
        lock.withLock {
            if entries.count >= Self.capacity { entries.removeAll(keepingCapacity: true) }
            entries[key] = (verified, validity)
        }
    }
}
