import Crypto

/// Ed25519 (RFC 8032) through swift-crypto's public API: BoringSSL on Linux, CryptoKit on Apple platforms, so the
/// device side needs no libsodium. The keys are the same 32-byte seeds and public keys libsodium's `crypto_sign`
/// makes, and the signatures verify under either.
public enum Ed25519 {
    /// Whether `signature` is a valid Ed25519 signature of `message` by `publicKey` (32 bytes).
    public static func verify(_ signature: [UInt8], of message: [UInt8], publicKey: [UInt8]) -> Bool {
        guard signature.count == 64, let key = try? Curve25519.Signing.PublicKey(rawRepresentation: publicKey) else {
            return false
        }
        return key.isValidSignature(signature, for: message)
    }

    /// The signature of `message` by the key with this 32-byte seed.
    static func sign(_ message: [UInt8], seed: [UInt8]) -> [UInt8] {
        // A 32-byte seed is always a valid key, and signing with a valid key does not fail.
        let key = try! Curve25519.Signing.PrivateKey(rawRepresentation: seed)
        return Array(try! key.signature(for: message))
    }
}

/// Random bytes from the operating system's CSPRNG (`getrandom` on Linux, `SecRandomCopyBytes`' source on Apple).
public enum SecureRandom {
    public static func bytes(_ count: Int) -> [UInt8] {
        var generator = SystemRandomNumberGenerator()
        return (0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) }
    }
}
