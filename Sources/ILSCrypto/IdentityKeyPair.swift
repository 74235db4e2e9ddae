import Crypto
public import ILSCore

/// An identity's Ed25519 key pair, generated on this machine (swift-crypto: BoringSSL on Linux, CryptoKit on Apple
/// platforms). The same 32-byte seed and public key libsodium's `crypto_sign_keypair` makes (RFC 8032 §5.1.5).
public struct IdentityKeyPair: Sendable {
    public let publicKey: [UInt8]
    private let seed: [UInt8]

    /// A fresh key pair from the system's CSPRNG.
    public static func generate() -> IdentityKeyPair {
        let key = Curve25519.Signing.PrivateKey()
        return IdentityKeyPair(publicKey: Array(key.publicKey.rawRepresentation), seed: Array(key.rawRepresentation))
    }

    private init(publicKey: [UInt8], seed: [UInt8]) {
        self.publicKey = publicKey
        self.seed = seed
    }

    /// Loads the key from an identity file's PKCS#8 PEM (RFC 8410).
    public init(privateKeyPEM: String) throws(ILSError) {
        let seed = try Ed25519PKCS8.seed(fromPEM: privateKeyPEM)
        guard let key = try? Curve25519.Signing.PrivateKey(rawRepresentation: seed) else {
            throw ILSError(.invalidInput, "the private key is not a valid Ed25519 key")
        }
        self.seed = seed
        self.publicKey = Array(key.publicKey.rawRepresentation)
    }

    /// The seed, for signing enrollment tokens with `EnrollmentToken.sign`. Never serialise it anywhere but a
    /// 0600 key file.
    public var seedForSigning: [UInt8] { seed }

    public func sign(_ message: [UInt8]) -> [UInt8] {
        Ed25519.sign(message, seed: seed)
    }

    /// PKCS#8 PEM (RFC 8410), the form TLS stacks load.
    public var privateKeyPEM: String { Ed25519PKCS8.pem(seed: seed) }
}
