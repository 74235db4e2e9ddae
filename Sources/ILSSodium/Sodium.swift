import CSodium

/// libsodium, for what only the older handshake versions need: BLAKE2b and secretstream (docs/design/overlay.md,
/// "End to end"). Only gateways and tests link this target; devices, and everything ILSClient reaches, do not.
enum Sodium {
    /// `sodium_init` is idempotent and thread-safe; every entry point calls it first.
    private static let initialized: Bool = sodium_init() >= 0

    static func ensureInitialized() {
        precondition(initialized, "libsodium failed to initialise")
    }

    /// BLAKE2b (RFC 7693) of `message`, `length` bytes, keyed with `key` when it is not empty.
    static func blake2b(_ message: [UInt8], key: [UInt8] = [], length: Int) -> [UInt8] {
        ensureInitialized()
        var out = [UInt8](repeating: 0, count: length)
        let result = crypto_generichash(
            &out,
            length,
            message,
            UInt64(message.count),
            key.isEmpty ? nil : key,
            key.count
        )
        precondition(result == 0, "crypto_generichash refused its arguments")
        return out
    }
}
