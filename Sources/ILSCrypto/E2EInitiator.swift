import Crypto
public import Foundation
public import ILSCore

/// The device side of the end-to-end handshake: sends ClientHello, checks ServerHello, sends ClientFinished.
public final class E2EInitiator {
    private let credentials: E2EHandshake.Credentials
    private let service: String
    private let suites: [E2ESuite]
    private let version: any E2EHandshakeVersion
    private let ephemeral = Curve25519.KeyAgreement.PrivateKey()
    private let ephemeralPublic: [UInt8]
    private let nonce: [UInt8]
    private let recordsPerKey: UInt64

    /// A device speaking `version` (by default the current one, 3), offering `suites` for its records, most
    /// preferred first (by default all the version has). Tests and the fuzz targets pass older versions from
    /// ILSSodium to check that gateways still serve such devices.
    public init(
        credentials: E2EHandshake.Credentials,
        service: String,
        version: any E2EHandshakeVersion = E2EHandshake.version,
        suites: [E2ESuite]? = nil,
        recordsPerKey: UInt64 = E2ERecord.recordsPerKey
    ) {
        let suites = version.negotiatesSuite ? (suites ?? version.suites) : version.suites
        // Offering a suite the version does not agree is allowed (the hostile tests do it); the gateway refuses it.
        precondition(!suites.isEmpty)
        self.credentials = credentials
        self.service = service
        self.suites = suites
        self.version = version
        self.ephemeralPublic = Array(ephemeral.publicKey.rawRepresentation)
        self.nonce = SecureRandom.bytes(32)
        self.recordsPerKey = recordsPerKey
    }

    private var offeredSuites: [UInt8] { suites.map(\.rawValue) }

    /// ClientHello: type, version, service, our certificate, our ephemeral key, our nonce, the suites we offer.
    public func clientHello() -> [UInt8] {
        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.clientHello.rawValue)
        writer.u8(version.number)
        writer.variable(Array(service.utf8))
        writer.variable(credentials.certificateDER)
        writer.fixed(ephemeralPublic)
        writer.fixed(nonce)
        if version.negotiatesSuite { writer.variable(offeredSuites) }
        return writer.bytes
    }

    /// Checks ServerHello and returns ClientFinished plus the established session.
    public func receiveServerHello(_ message: [UInt8], now: Date = Date()) throws(ILSError) -> (
        clientFinished: [UInt8], session: E2ESession
    ) {
        var reader = HandshakeReader(bytes: message)
        guard try reader.u8() == E2EHandshake.MessageType.serverHello.rawValue,
            try reader.u8() == version.number
        else { throw E2EHandshake.failure("unexpected message or version") }
        let chosen = version.negotiatesSuite ? try reader.u8() : suites[0].rawValue
        guard let suite = E2ESuite(rawValue: chosen), suites.contains(suite), version.suites.contains(suite) else {
            throw E2EHandshake.failure("the gateway chose record protection this device did not offer")
        }
        let peerCertificate = try reader.variable()
        let peerEphemeral = try reader.fixed(E2EHandshake.ephemeralKeyLength)
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
        if version.negotiatesSuite { parts += [offeredSuites, [suite.rawValue]] }
        let transcript = version.transcript(parts)
        guard
            Ed25519.verify(signature, of: E2EHandshake.signed("responder", transcript), publicKey: peer.publicKey)
        else { throw E2EHandshake.failure("the gateway's signature does not match the handshake") }

        guard let shared = E2EHandshake.sharedSecret(ephemeral, peerEphemeral) else {
            throw E2EHandshake.failure("the gateway's ephemeral key is unusable")
        }
        let keys = version.keys(
            sharedSecret: shared,
            initiatorEphemeral: ephemeralPublic,
            responderEphemeral: peerEphemeral,
            transcript: transcript
        )
        let sender = version.sender(suite: suite, key: keys.initiatorToResponder, recordsPerKey: recordsPerKey)
        let receiver = try version.receiver(
            suite: suite,
            key: keys.responderToInitiator,
            header: peerHeader,
            recordsPerKey: recordsPerKey
        )

        var writer = HandshakeWriter()
        writer.u8(E2EHandshake.MessageType.clientFinished.rawValue)
        writer.fixed(credentials.keyPair.sign(E2EHandshake.signed("initiator", transcript)))
        writer.fixed(sender.header)
        return (
            writer.bytes,
            E2ESession(
                sender: sender,
                receiver: receiver,
                peer: peer,
                service: service,
                resume: suite.isResumable ? E2EResumeSecrets(keys: keys) : nil
            )
        )
    }
}
