import CSodium
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
            peer: IdentityCertificate,
            service: String
        )
        case done
    }

    private let credentials: E2EHandshake.Credentials
    private let suites: Set<E2ESuite>
    private var state = State.awaitingHello

    /// `suites` is what this gateway accepts; it takes the first of the device's offer that is among them.
    public init(credentials: E2EHandshake.Credentials, suites: Set<E2ESuite> = Set(E2ESuite.allCases)) {
        Sodium.ensureInitialized()
        self.credentials = credentials
        self.suites = suites
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
        let version = try reader.u8()
        guard E2EHandshake.versions.contains(version) else {
            throw E2EHandshake.failure("handshake version \(version) is not supported (this gateway speaks 1 and 2)")
        }
        let serviceBytes = try reader.variable()
        let peerCertificate = try reader.variable()
        let peerEphemeral = try reader.fixed(Int(crypto_kx_PUBLICKEYBYTES))
        let peerNonce = try reader.fixed(32)
        // Version 1 has no suite list: its records are secretstream's.
        let offered = version == 1 ? nil : try reader.variable()
        try reader.end()
        guard let service = String(validating: serviceBytes, as: UTF8.self), !service.isEmpty else {
            throw E2EHandshake.failure("invalid service name")
        }
        let candidates = offered ?? [E2ESuite.xchacha20poly1305.rawValue]
        guard let suite = candidates.lazy.compactMap(E2ESuite.init(rawValue:)).first(where: suites.contains) else {
            throw E2EHandshake.failure("the device offers no record protection this gateway accepts")
        }
        let peer = try E2EHandshake.verifyPeer(peerCertificate, authority: credentials.authority, now: now)

        var ephemeralPublic = [UInt8](repeating: 0, count: Int(crypto_kx_PUBLICKEYBYTES))
        var ephemeralSecret = [UInt8](repeating: 0, count: Int(crypto_kx_SECRETKEYBYTES))
        defer { sodium_memzero(&ephemeralSecret, ephemeralSecret.count) }
        crypto_kx_keypair(&ephemeralPublic, &ephemeralSecret)
        let nonce = Sodium.randomBytes(32)
        var parts = [
            serviceBytes, Array(peer.id.utf8), Array(credentials.identityID.utf8), peerCertificate,
            credentials.certificateDER, peerEphemeral, ephemeralPublic, peerNonce, nonce,
        ]
        if let offered { parts += [offered, [suite.rawValue]] }
        let transcript = E2EHandshake.transcript(version: version, parts)
        var receiveKey = [UInt8](repeating: 0, count: Int(crypto_kx_SESSIONKEYBYTES))
        var sendKey = [UInt8](repeating: 0, count: Int(crypto_kx_SESSIONKEYBYTES))
        guard
            crypto_kx_server_session_keys(&receiveKey, &sendKey, ephemeralPublic, ephemeralSecret, peerEphemeral)
                == 0
        else { throw E2EHandshake.failure("the device's ephemeral key is unusable") }
        let sender = E2ERecordSender(suite: suite, key: E2EHandshake.bind(sendKey, to: transcript))
        sodium_memzero(&sendKey, sendKey.count)

        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.serverHello.rawValue)
        writer.u8(version)
        if offered != nil { writer.u8(suite.rawValue) }
        writer.variable(credentials.certificateDER)
        writer.fixed(ephemeralPublic)
        writer.fixed(nonce)
        writer.fixed(credentials.keyPair.sign(E2EHandshake.signed("responder", transcript)))
        writer.fixed(sender.header)
        state = .awaitingFinished(
            transcript: transcript,
            sender: sender,
            receiveKey: E2EHandshake.bind(receiveKey, to: transcript),
            peer: peer,
            service: service
        )
        sodium_memzero(&receiveKey, receiveKey.count)
        return (writer.bytes, service, peer)
    }

    /// Checks the device's signature over this handshake's transcript; returns the established session.
    public func receiveClientFinished(_ message: [UInt8]) throws(ILSError) -> E2ESession {
        guard case .awaitingFinished(let transcript, let sender, let receiveKey, let peer, let service) = state else {
            throw E2EHandshake.failure("unexpected ClientFinished")
        }
        state = .done
        var reader = HandshakeReader(bytes: message)
        guard try reader.u8() == E2EHandshake.MessageType.clientFinished.rawValue else {
            throw E2EHandshake.failure("unexpected message")
        }
        let signature = try reader.fixed(64)
        let peerHeader = try reader.fixed(sender.suite.headerLength)
        try reader.end()
        guard
            Sodium.verify(signature, of: E2EHandshake.signed("initiator", transcript), publicKey: peer.publicKey)
        else { throw E2EHandshake.failure("the device's signature does not match the handshake") }
        let receiver = try E2ERecordReceiver(suite: sender.suite, key: receiveKey, header: peerHeader)
        return E2ESession(sender: sender, receiver: receiver, peer: peer, service: service)
    }
}
