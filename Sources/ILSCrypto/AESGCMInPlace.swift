// The one file of the project that imports a module swift-crypto does not offer as a product: `CCryptoBoringSSL`, the
// BoringSSL swift-crypto builds on Linux. Its AEAD seals straight into the record being framed and opens straight
// into the plaintext buffer; swift-crypto's public `AES.GCM` API returns a sealed box and a `Data` instead, and its
// copies in and out cost several times the CPU of the AEAD itself (`ils-bench aead`; docs/design/private-api.md).
// What keeps this exception honest:
// - `AEADPathTests` fails a Linux build that silently lost this path (a renamed module would make `canImport` false);
// - `AESGCMBackendTests` checks both paths give and accept the same bytes;
// - swift-crypto is pinned to 4.5.x in Package.swift, and `deploy/check-private-api.sh` (CI) fails on any other import
//   of swift-crypto's internal modules and on a resolved swift-crypto outside the pin.
// Apple platforms and the `AppleCodePath` build never compile this file's code: CryptoKit has no such module.
#if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
import CCryptoBoringSSL
package import Crypto

extension AESGCMRecords {
    /// Runs `body` with an AES-256-GCM context for `key` on the stack, wiped afterwards. Setting one up costs far less
    /// than sealing a record, and keeping one per direction would add 1.1 KiB to every open stream.
    private static func withContext<T>(_ key: SymmetricKey, _ body: (UnsafePointer<EVP_AEAD_CTX>) -> T) -> T {
        withUnsafeTemporaryAllocation(of: EVP_AEAD_CTX.self, capacity: 1) { context in
            let ready = key.withUnsafeBytes { key in
                CCryptoBoringSSL_EVP_AEAD_CTX_init(
                    context.baseAddress,
                    CCryptoBoringSSL_EVP_aead_aes_256_gcm(),
                    key.baseAddress?.assumingMemoryBound(to: UInt8.self),
                    key.count,
                    16,
                    nil
                )
            }
            // Only a key of the wrong length fails, and the key is always 32 bytes.
            precondition(ready == 1, "AES-256-GCM context setup failed")
            defer {
                CCryptoBoringSSL_EVP_AEAD_CTX_cleanup(context.baseAddress)
                CCryptoBoringSSL_OPENSSL_cleanse(context.baseAddress, MemoryLayout<EVP_AEAD_CTX>.size)
            }
            return body(context.baseAddress!)
        }
    }

    /// Encrypts straight into the record: no intermediate buffers.
    package static func sealInPlace(
        _ plaintext: UnsafeRawBufferPointer,
        flags: UInt8,
        key: SymmetricKey,
        nonce: UnsafeRawBufferPointer,
        ciphertext: UnsafeMutableRawBufferPointer,
        tag: UnsafeMutableRawBufferPointer
    ) {
        var flags = flags
        var empty: UInt8 = 0
        let sealed = withContext(key) { context in
            withUnsafeMutablePointer(to: &empty) { empty in
                var tagLength = 0
                let result = CCryptoBoringSSL_EVP_AEAD_CTX_seal_scatter(
                    context,
                    ciphertext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty,
                    tag.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    &tagLength,
                    tag.count,
                    nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    nonce.count,
                    plaintext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(empty),
                    plaintext.count,
                    nil,
                    0,
                    &flags,
                    1
                )
                return result == 1 && tagLength == tag.count
            }
        }
        precondition(sealed, "AES-256-GCM seal failed")
    }

    /// Checks the tag and decrypts straight into `output`; `false` if the record is not authentic.
    package static func openInPlace(
        _ ciphertext: UnsafeRawBufferPointer,
        tag: UnsafeRawBufferPointer,
        flags: UnsafeRawBufferPointer,
        key: SymmetricKey,
        nonce: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) -> Bool {
        var empty: UInt8 = 0
        return withContext(key) { context in
            withUnsafeMutablePointer(to: &empty) { empty in
                CCryptoBoringSSL_EVP_AEAD_CTX_open_gather(
                    context,
                    output.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? empty,
                    nonce.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    nonce.count,
                    ciphertext.baseAddress?.assumingMemoryBound(to: UInt8.self) ?? UnsafePointer(empty),
                    ciphertext.count,
                    tag.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    tag.count,
                    flags.baseAddress!.assumingMemoryBound(to: UInt8.self),
                    flags.count
                ) == 1
            }
        }
    }
}
#endif
