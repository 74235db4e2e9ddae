import CSodium
public import Foundation
public import ILSCore

/// The device side of the end-to-end handshake: sends ClientHello, checks ServerHello, sends ClientFinished.
public final class E2EInitiator {
    private let credentials: E2EHandshake.Credentials
    private let service: String
    private let suites: [E2ESuite]
    private let version: UInt8
    private var ephemeralPublic = [UInt8](repeating: 0, count: Int(crypto_kx_PUBLICKEYBYTES))
    private var ephemeralSecret = [UInt8](repeating: 0, count: Int(crypto_kx_SECRETKEYBYTES))
    private let nonce: [UInt8]

    /// `suites` is what this device offers for its records, most preferred first (at least one).
    public convenience init(
        credentials: E2EHandshake.Credentials,
        service: String,
        suites: [E2ESuite] = E2ESuite.offered
    ) {
        self.init(credentials: credentials, service: service, suites: suites, version: E2EHandshake.version)
    }

    /// A device speaking an older handshake `version`; version 1 offers no suites (its records are secretstream's).
    /// Tests use it to check that gateways still serve such devices.
    package init(credentials: E2EHandshake.Credentials, service: String, suites: [E2ESuite], version: UInt8) {
        precondition(!suites.isEmpty && E2EHandshake.versions.contains(version))
        Sodium.ensureInitialized()
        self.credentials = credentials
        self.service = service
        self.suites = version == 1 ? [.xchacha20poly1305] : suites
        self.version = version
        crypto_kx_keypair(&ephemeralPublic, &ephemeralSecret)
        nonce = Sodium.randomBytes(32)
    }

    deinit {
        sodium_memzero(&ephemeralSecret, ephemeralSecret.count)
    }

    private var offeredSuites: [UInt8] { suites.map(\.rawValue) }

    /// ClientHello: type, version, service, our certificate, our ephemeral key, our nonce, the suites we offer.
    public func clientHello() -> [UInt8] {
        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.clientHello.rawValue)
        writer.u8(version)
        writer.variable(Array(service.utf8))
        writer.variable(credentials.certificateDER)
        writer.fixed(ephemeralPublic)
        writer.fixed(nonce)
        if version > 1 { writer.variable(offeredSuites) }
        return writer.bytes
    }

    /// Checks ServerHello and returns ClientFinished plus the established session.
    public func receiveServerHello(_ message: [UInt8], now: Date = Date()) throws(ILSError) -> (
        clientFinished: [UInt8], session: E2ESession
    ) {
        var reader = HandshakeReader(bytes: message)
        guard try reader.u8() == E2EHandshake.MessageType.serverHello.rawValue,
            try reader.u8() == version
        else { throw E2EHandshake.failure("unexpected message or version") }
        let chosen = version > 1 ? try reader.u8() : E2ESuite.xchacha20poly1305.rawValue
        guard let suite = E2ESuite(rawValue: chosen), suites.contains(suite) else {
            throw E2EHandshake.failure("the gateway chose record protection this device did not offer")
        }
        let peerCertificate = try reader.variable()
        let peerEphemeral = try reader.fixed(Int(crypto_kx_PUBLICKEYBYTES))
        let peerNonce = try reader.fixed(32)
        let signature = try reader.fixed(64)
        let peerHeader = try reader.fixed(suite.headerLength)
        try reader.end()

        let peer = try E2EHandshake.verifyPeer(peerCertificate, authority: credentials.authority, now: now)
        guard peer.role == .gateway else { throw E2EHandshake.failure("the peer is not a gateway") }
        var parts = [
            Array(service.utf8), Array(credentials.identityID.utf8), Array(peer.id.utf8), credentials.certificateDER,
            peerCertificate, ephemeralPublic, peerEphemeral, nonce, peerNonce,
        ]
        if version > 1 { parts += [offeredSuites, [suite.rawValue]] }
        let transcript = E2EHandshake.transcript(version: version, parts)
        guard
            Sodium.verify(signature, of: E2EHandshake.signed("responder", transcript), publicKey: peer.publicKey)
        else { throw E2EHandshake.failure("the gateway's signature does not match the handshake") }

        var receiveKey = [UInt8](repeating: 0, count: Int(crypto_kx_SESSIONKEYBYTES))
        var sendKey = [UInt8](repeating: 0, count: Int(crypto_kx_SESSIONKEYBYTES))
        guard
            crypto_kx_client_session_keys(&receiveKey, &sendKey, ephemeralPublic, ephemeralSecret, peerEphemeral)
                == 0
        else { throw E2EHandshake.failure("the gateway's ephemeral key is unusable") }
        let sender = E2ERecordSender(suite: suite, key: E2EHandshake.bind(sendKey, to: transcript))
        let receiver = try E2ERecordReceiver(
            suite: suite,
            key: E2EHandshake.bind(receiveKey, to: transcript),
            header: peerHeader
        )
        sodium_memzero(&receiveKey, receiveKey.count)
        sodium_memzero(&sendKey, sendKey.count)

        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.clientFinished.rawValue)
        writer.fixed(credentials.keyPair.sign(E2EHandshake.signed("initiator", transcript)))
        writer.fixed(sender.header)
        return (writer.bytes, E2ESession(sender: sender, receiver: receiver, peer: peer, service: service))
    }
}
