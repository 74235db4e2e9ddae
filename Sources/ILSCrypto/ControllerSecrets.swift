import Crypto
public import Foundation
public import ILSCore

/// What every controller replica of one cluster shares besides the store: the CA's key and the token-signing key.
///
/// `controller join` moves them from a running controller to a new replica, sealed with HPKE (RFC 9180, base mode,
/// DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305) to a one-time X25519 key the replica made for that
/// request. The admin API's TLS already authenticates both ends; the seal keeps the keys out of anything that sees
/// the request's plaintext (a debugging proxy, a log of bodies) and binds them to the replica that asked.
public struct ControllerSecrets: Codable, Sendable {
    public var caKey: String
    public var tokenKey: String

    public init(caKey: String, tokenKey: String) {
        self.caKey = caKey
        self.tokenKey = tokenKey
    }

    static var info: Data { Data("ils-controller-join-v1".utf8) }
    static let suite = HPKE.Ciphersuite.Curve25519_SHA256_ChachaPoly

    /// Seals these secrets to `publicKey` (32 bytes, X25519); `context` (the replica's address) is authenticated.
    public func sealed(to publicKey: [UInt8], context: String) throws(ILSError)
        -> (encapsulatedKey: [UInt8], ciphertext: [UInt8])
    {
        do {
            let recipient = try Curve25519.KeyAgreement.PublicKey(rawRepresentation: publicKey)
            var sender = try HPKE.Sender(recipientKey: recipient, ciphersuite: Self.suite, info: Self.info)
            let ciphertext = try sender.seal(try JSONEncoder().encode(self), authenticating: Data(context.utf8))
            return (Array(sender.encapsulatedKey), Array(ciphertext))
        } catch {
            throw ILSError(.invalidArgument, "the replica's public key is not a valid X25519 key")
        }
    }

    /// The replica's side: a one-time key pair for one join request.
    public struct Opener: Sendable {
        private let privateKey = Curve25519.KeyAgreement.PrivateKey()

        public init() {}

        public var publicKey: [UInt8] { Array(privateKey.publicKey.rawRepresentation) }

        public func open(encapsulatedKey: [UInt8], ciphertext: [UInt8], context: String) throws(ILSError)
            -> ControllerSecrets
        {
            do {
                var recipient = try HPKE.Recipient(
                    privateKey: privateKey,
                    ciphersuite: ControllerSecrets.suite,
                    info: ControllerSecrets.info,
                    encapsulatedKey: Data(encapsulatedKey)
                )
                let plaintext = try recipient.open(Data(ciphertext), authenticating: Data(context.utf8))
                return try JSONDecoder().decode(ControllerSecrets.self, from: plaintext)
            } catch {
                throw ILSError(.invalidInput, "the controller's sealed secrets could not be opened")
            }
        }
    }
}
