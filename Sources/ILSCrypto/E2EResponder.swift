import Crypto
public import Foundation
public import ILSCore

/// The gateway side of the end-to-end handshake: checks ClientHello, answers ServerHello, checks ClientFinished.
///
/// Nothing is forwarded to a backend until `receiveClientFinished` has returned: only then is the device's
/// possession of its identity key proven for this very handshake.
public final class E2EResponder {
    private enum State {
        case awaitingHello
        case awaitingFinished(
            transcript: [UInt8],
            sender: E2ERecordSender,
            receiveKey: [UInt8],
            resume: E2EResumeSecrets?,
            version: any E2EHandshakeVersion,
            peer: IdentityCertificate,
            service: String
        )
        case done
    }

    private let credentials: E2EHandshake.Credentials
    private let versions: [UInt8: any E2EHandshakeVersion]
    private let suites: Set<E2ESuite>
    private let recordsPerKey: UInt64
    private var state = State.awaitingHello

    /// `versions` is every handshake version this gateway answers (by default only 3: a gateway passes ILSSodium's
    /// `E2EHandshakeVersions.all` to serve older devices too); `suites` what it accepts, taking the first of the
    /// device's offer that is among them.
    public init(
        credentials: E2EHandshake.Credentials,
        versions: [any E2EHandshakeVersion] = [E2EHandshake.version],
        suites: Set<E2ESuite> = Set(E2ESuite.allCases),
        recordsPerKey: UInt64 = E2ERecord.recordsPerKey
    ) {
        self.credentials = credentials
        self.versions = Dictionary(versions.map { ($0.number, $0) }, uniquingKeysWith: { first, _ in first })
        self.suites = suites
        self.recordsPerKey = recordsPerKey
    }

    /// The versions answered, for refusals a person reads ("this gateway speaks 1, 2 and 3").
    private var spoken: String {
        let numbers = versions.keys.sorted().map(String.init)
        return numbers.count == 1 ? numbers[0] : numbers.dropLast().joined(separator: ", ") + " and " + numbers.last!
    }

    /// Checks ClientHello and returns ServerHello, the service asked for, and the (not yet proven) peer: the caller
    /// may refuse by policy before answering.
    public func receiveClientHello(_ message: [UInt8], now: Date = Date()) throws(ILSError) -> (
        serverHello: [UInt8], service: String, peer: IdentityCertificate
    ) {
        guard case .awaitingHello = state else { throw E2EHandshake.failure("unexpected ClientHello") }
        state = .done
        var reader = HandshakeReader(bytes: message)
        guard try reader.u8() == E2EHandshake.MessageType.clientHello.rawValue else {
            throw E2EHandshake.failure("unexpected message")
        }
        let number = try reader.u8()
        guard let version = versions[number] else {
            throw E2EHandshake.failure("handshake version \(number) is not supported (this gateway speaks \(spoken))")
        }
        let serviceBytes = try reader.variable()
        let peerCertificate = try reader.variable()
        let peerEphemeral = try reader.fixed(E2EHandshake.ephemeralKeyLength)
        let peerNonce = try reader.fixed(32)
        // Version 1 has no suite list: its records are secretstream's.
        let offered = version.negotiatesSuite ? try reader.variable() : nil
        try reader.end()
        guard let service = String(validating: serviceBytes, as: UTF8.self), !service.isEmpty else {
            throw E2EHandshake.failure("invalid service name")
        }
        let candidates = offered ?? version.suites.map(\.rawValue)
        guard
            let suite = candidates.lazy.compactMap(E2ESuite.init(rawValue:)).first(where: {
                suites.contains($0) && version.suites.contains($0)
            })
        else { throw E2EHandshake.failure("the device offers no record protection this gateway accepts") }
        let peer = try E2EHandshake.verifyPeer(peerCertificate, authority: credentials.authority, now: now)

        let ephemeral = Curve25519.KeyAgreement.PrivateKey()
        let ephemeralPublic = Array(ephemeral.publicKey.rawRepresentation)
        let nonce = SecureRandom.bytes(32)
        var parts = [
            serviceBytes, Array(peer.id.utf8), Array(credentials.identityID.utf8), peerCertificate,
            credentials.certificateDER, peerEphemeral, ephemeralPublic, peerNonce, nonce,
        ]
        if let offered { parts += [offered, [suite.rawValue]] }
        let transcript = version.transcript(parts)
        guard let shared = E2EHandshake.sharedSecret(ephemeral, peerEphemeral) else {
            throw E2EHandshake.failure("the device's ephemeral key is unusable")
        }
        let keys = version.keys(
            sharedSecret: shared,
            initiatorEphemeral: peerEphemeral,
            responderEphemeral: ephemeralPublic,
            transcript: transcript
        )
        let sender = version.sender(suite: suite, key: keys.responderToInitiator, recordsPerKey: recordsPerKey)

        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.serverHello.rawValue)
        writer.u8(version.number)
        if offered != nil { writer.u8(suite.rawValue) }
        writer.variable(credentials.certificateDER)
        writer.fixed(ephemeralPublic)
        writer.fixed(nonce)
        writer.fixed(credentials.keyPair.sign(E2EHandshake.signed("responder", transcript)))
        writer.fixed(sender.header)
        state = .awaitingFinished(
            transcript: transcript,
            sender: sender,
            receiveKey: keys.initiatorToResponder,
            resume: suite.isResumable ? E2EResumeSecrets(keys: keys) : nil,
            version: version,
            peer: peer,
            service: service
        )
        return (writer.bytes, service, peer)
    }

    /// Checks the device's signature over this handshake's transcript; returns the established session.
    public func receiveClientFinished(_ message: [UInt8]) throws(ILSError) -> E2ESession {
        guard
            case .awaitingFinished(
                let transcript,
                let sender,
                let receiveKey,
                let resume,
                let version,
                let peer,
                let service
            ) = state
        else { throw E2EHandshake.failure("unexpected ClientFinished") }
        state = .done
        var reader = HandshakeReader(bytes: message)
        guard try reader.u8() == E2EHandshake.MessageType.clientFinished.rawValue else {
            throw E2EHandshake.failure("unexpected message")
        }
        let signature = try reader.fixed(64)
        let peerHeader = try reader.fixed(sender.suite.headerLength)
        try reader.end()
        guard
            Ed25519.verify(signature, of: E2EHandshake.signed("initiator", transcript), publicKey: peer.publicKey)
        else { throw E2EHandshake.failure("the device's signature does not match the handshake") }
        let receiver = try version.receiver(
            suite: sender.suite,
            key: receiveKey,
            header: peerHeader,
            recordsPerKey: recordsPerKey
        )
        return E2ESession(sender: sender, receiver: receiver, peer: peer, service: service, resume: resume)
    }
}
