import CSodium

/// The libsodium primitives ils-gateway uses, behind a small Swift surface.
///
/// Identity keys are made here, on the machine that will hold them, with `crypto_sign_keypair` (Ed25519); the
/// private half never leaves that machine (the trust model's first rule).
public enum Sodium {
    /// `sodium_init` is idempotent and thread-safe; every entry point calls it first.
    private static let initialized: Bool = sodium_init() >= 0

    static func ensureInitialized() {
        precondition(initialized, "libsodium failed to initialise")
    }

    /// A fresh Ed25519 key pair: the 32-byte public key and the 32-byte seed the secret key derives from.
    public static func signKeyPair() -> (publicKey: [UInt8], seed: [UInt8]) {
        ensureInitialized()
        var publicKey = [UInt8](repeating: 0, count: Int(crypto_sign_PUBLICKEYBYTES))
        var secretKey = [UInt8](repeating: 0, count: Int(crypto_sign_SECRETKEYBYTES))
        let result = crypto_sign_keypair(&publicKey, &secretKey)
        precondition(result == 0, "crypto_sign_keypair failed")
        // libsodium's secret key is seed ‖ public key; the seed alone is the portable form (RFC 8032 §5.1.5).
        let seed = Array(secretKey[0..<Int(crypto_sign_SEEDBYTES)])
        sodium_memzero(&secretKey, secretKey.count)
        return (publicKey, seed)
    }

    /// An Ed25519 signature (RFC 8032) of `message` by the key with this seed.
    public static func sign(_ message: [UInt8], seed: [UInt8]) -> [UInt8] {
        ensureInitialized()
        precondition(seed.count == Int(crypto_sign_SEEDBYTES))
        var publicKey = [UInt8](repeating: 0, count: Int(crypto_sign_PUBLICKEYBYTES))
        var secretKey = [UInt8](repeating: 0, count: Int(crypto_sign_SECRETKEYBYTES))
        defer { sodium_memzero(&secretKey, secretKey.count) }
        crypto_sign_seed_keypair(&publicKey, &secretKey, seed)
        var signature = [UInt8](repeating: 0, count: Int(crypto_sign_BYTES))
        crypto_sign_detached(&signature, nil, message, UInt64(message.count), secretKey)
        return signature
    }

    /// Whether `signature` is a valid Ed25519 signature of `message` by `publicKey`.
    public static func verify(_ signature: [UInt8], of message: [UInt8], publicKey: [UInt8]) -> Bool {
        ensureInitialized()
        guard signature.count == Int(crypto_sign_BYTES), publicKey.count == Int(crypto_sign_PUBLICKEYBYTES) else {
            return false
        }
        return crypto_sign_verify_detached(signature, message, UInt64(message.count), publicKey) == 0
    }

    /// Cryptographically secure random bytes.
    public static func randomBytes(_ count: Int) -> [UInt8] {
        ensureInitialized()
        var bytes = [UInt8](repeating: 0, count: count)
        randombytes_buf(&bytes, count)
        return bytes
    }
}
