import CSodium
import Crypto
import Foundation
public import ILSCore

#if canImport(CCryptoBoringSSL)
// swift-crypto's BoringSSL (its backend wherever CryptoKit is absent): its AEAD API seals and opens in place, which
// the Swift API cannot (see `AESGCMRecords`).
import CCryptoBoringSSL
#endif

/// How an end-to-end circuit's records are protected, agreed in the handshake (docs/protocol.md, "Records").
///
/// Both suites add the same 17 bytes to a record, bind each record to its position in the direction, and mark the
/// direction's last record FINAL, so the layers above don't depend on which one a circuit runs.
public enum E2ESuite: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// libsodium's `crypto_secretstream_xchacha20poly1305`: the only suite of handshake version 1, and the one for a
    /// device without AES instructions.
    case xchacha20poly1305 = 1
    /// AES-256-GCM with a counter nonce (swift-crypto: BoringSSL's VAES/AES-NI code, CryptoKit on Apple systems), about
    /// three times libsodium's secretstream on a CPU with AES instructions.
    case aes256gcm = 2

    /// What a device offers, most preferred first.
    public static let offered: [E2ESuite] = [.aes256gcm, .xchacha20poly1305]

    /// The bytes each side's handshake message carries for the direction it sends (secretstream's header; AES-GCM
    /// needs none: its nonces come from the key).
    public var headerLength: Int {
        switch self {
        case .xchacha20poly1305: SecretStream.headerLength
        case .aes256gcm: 0
        }
    }

    public var description: String {
        switch self {
        case .xchacha20poly1305: "xchacha20poly1305-secretstream"
        case .aes256gcm: "aes256gcm"
        }
    }
}

/// What every record adds to its plaintext, whichever the suite.
public enum E2ERecord {
    public static let overhead = 17
    /// How many AES-GCM records one key seals before both ends move to the next (see `AESGCMRecords`).
    public static let recordsPerKey: UInt64 = 1 << 20
}

/// The sending half of a circuit's records. Holds the suite's state inline (one object per direction besides the
/// key), since a gateway keeps one pair per open stream.
public final class E2ERecordSender {
    private let stream: SecretStreamSender?
    private var gcm: AESGCMRecords?
    public let suite: E2ESuite
    /// What the receiver needs first (`suite.headerLength` bytes), sent in this side's handshake message.
    public var header: [UInt8] { stream?.header ?? [] }

    /// A sender keyed with a 32-byte key. `recordsPerKey` (AES-GCM only) is how many records one key seals before
    /// both ends move to the next; tests lower it to reach the change.
    public init(suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64 = E2ERecord.recordsPerKey) {
        self.suite = suite
        switch suite {
        case .xchacha20poly1305:
            stream = SecretStreamSender(key: key)
        case .aes256gcm:
            stream = nil
            gcm = AESGCMRecords(key: key, recordsPerKey: recordsPerKey)
        }
    }

    /// Seals `plaintext` straight into `output` (at least `plaintext.count + E2ERecord.overhead` bytes).
    public func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, final: Bool) {
        if let stream {
            stream.seal(plaintext, into: output, final: final)
        } else {
            gcm!.seal(plaintext, into: output, final: final)
        }
    }

    /// Seals one record into a new array.
    public func seal(_ plaintext: [UInt8], final: Bool = false) -> [UInt8] {
        var record = [UInt8](repeating: 0, count: plaintext.count + E2ERecord.overhead)
        plaintext.withUnsafeBytes { input in
            record.withUnsafeMutableBytes { output in seal(input, into: output, final: final) }
        }
        return record
    }
}

/// The receiving half of a circuit's records.
public final class E2ERecordReceiver {
    private let stream: SecretStreamReceiver?
    private var gcm: AESGCMRecords?
    /// Set by the first refusal: nothing opens after it.
    private var spent = false
    public let suite: E2ESuite
    /// Whether the FINAL record has been opened; nothing opens after it.
    public private(set) var finished = false

    /// A receiver for records sealed with `key`; `header` is what the sender's handshake message carried. Throws
    /// when the header is not the suite's length or not one secretstream accepts.
    public init(
        suite: E2ESuite,
        key: [UInt8],
        header: [UInt8],
        recordsPerKey: UInt64 = E2ERecord.recordsPerKey
    ) throws(ILSError) {
        self.suite = suite
        switch suite {
        case .xchacha20poly1305:
            stream = try SecretStreamReceiver(key: key, header: header)
        case .aes256gcm:
            guard header.isEmpty, key.count == AESGCMRecords.keyLength else { throw SecretStream.invalidRecord }
            stream = nil
            gcm = AESGCMRecords(key: key, recordsPerKey: recordsPerKey)
        }
    }

    /// Opens `record` straight into `output` (at least `record.count - E2ERecord.overhead` bytes); returns whether it
    /// was the FINAL record. Throws if it was altered, reordered, replayed, spliced, or comes after the final one; a
    /// receiver that threw opens nothing more.
    public func open(_ record: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws(ILSError)
        -> Bool
    {
        guard !finished, !spent else { throw SecretStream.invalidRecord }
        let final: Bool
        do throws(ILSError) {
            if let stream {
                final = try stream.open(record, into: output)
            } else {
                final = try gcm!.open(record, into: output)
            }
        } catch {
            spent = true
            throw error
        }
        if final { finished = true }
        return final
    }

    /// Opens one record into a new array.
    public func open(_ record: [UInt8]) throws(ILSError) -> (plaintext: [UInt8], final: Bool) {
        guard record.count >= E2ERecord.overhead else { throw SecretStream.invalidRecord }
        var plaintext = [UInt8](repeating: 0, count: record.count - E2ERecord.overhead)
        let final = record.withUnsafeBytes { input in
            plaintext.withUnsafeMutableBytes { output in
                Result { () throws(ILSError) in try open(input, into: output) }
            }
        }
        return (plaintext, try final.get())
    }
}

/// One direction of AES-256-GCM records: `u8 flags ‖ ciphertext ‖ 16-byte tag`, flags `0x01` on the FINAL record and
/// `0x00` otherwise, authenticated as the additional data.
///
/// The nonce of record `n` (counting from 0) is `iv XOR (0⁴ ‖ u64 n)`, where `iv` is the first 12 bytes of
/// `BLAKE2b-128(key = direction key, "ils-e2e-v2 iv")`: a receiver that opens a record at any other position than
/// the sender sealed it fails the tag, which is what refuses reordering, replay, dropping and splicing. The key is
/// unique to the circuit and direction (the handshake's ephemeral keys and nonces go into it), so no nonce repeats
/// under a key. After every `recordsPerKey` records both ends replace the key with `BLAKE2b-256(key = key,
/// "ils-e2e-v2 rekey")`, keeping the data under one key (at most 2²⁰ records of 64 KiB, 2³² AES blocks) far below
/// where GCM's confidentiality bound starts to matter, however long a circuit lives.
struct AESGCMRecords {
    static let keyLength = 32
    static let finalFlag: UInt8 = 0x01

    private var key: SymmetricKey
    /// The IV's first 4 bytes and last 8, big-endian: the nonce of record `n` is `ivHead ‖ (ivTail XOR n)`.
    private let ivHead: UInt32
    private let ivTail: UInt64
    private var counter: UInt64 = 0
    private let recordsPerKey: UInt64

    init(key: [UInt8], recordsPerKey: UInt64) {
        precondition(key.count == Self.keyLength && recordsPerKey > 0)
        self.key = SymmetricKey(data: key)
        let iv = Self.derive(key, "ils-e2e-v2 iv", length: 16)
        self.ivHead = iv[0..<4].reduce(0) { $0 << 8 | UInt32($1) }
        self.ivTail = iv[4..<12].reduce(0) { $0 << 8 | UInt64($1) }
        self.recordsPerKey = recordsPerKey
    }

    /// BLAKE2b with `key` as its key over `label`.
    private static func derive(_ key: some ContiguousBytes, _ label: String, length: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: length)
        let message = Array(label.utf8)
        key.withUnsafeBytes { key in
            _ = crypto_generichash(
                &out,
                length,
                message,
                UInt64(message.count),
                key.baseAddress!.assumingMemoryBound(to: UInt8.self),
                key.count
            )
        }
        return out
    }

    /// Moves to the next record: to the next key first when the current one has sealed its share. Returns the
    /// record's nonce, `iv XOR (0⁴ ‖ u64 n)`, as its first 4 bytes and last 8 (big-endian).
    private mutating func advance() -> (head: UInt32, tail: UInt64) {
        // 2⁶⁴ records would take centuries at any rate a machine can seal them.
        precondition(counter < UInt64.max, "end-to-end record counter exhausted")
        if counter > 0, counter % recordsPerKey == 0 {
            key = SymmetricKey(data: Self.derive(key, "ils-e2e-v2 rekey", length: Self.keyLength))
        }
        defer { counter += 1 }
        return (ivHead, ivTail ^ counter)
    }

    /// Calls `body` with the 12 bytes of the next record's nonce and the key to seal or open it with.
    private mutating func withNextNonce<T>(_ body: (UnsafeRawBufferPointer, SymmetricKey) -> T) -> T {
        let (head, tail) = advance()
        let key = self.key
        return withUnsafeTemporaryAllocation(byteCount: 12, alignment: 1) { nonce in
            nonce.storeBytes(of: head.bigEndian, toByteOffset: 0, as: UInt32.self)
            nonce.storeBytes(of: tail.bigEndian, toByteOffset: 4, as: UInt64.self)
            return body(UnsafeRawBufferPointer(nonce), key)
        }
    }

    /// Seals `plaintext` as `flags ‖ ciphertext ‖ tag` into `output`.
    mutating func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, final: Bool) {
        precondition(output.count >= plaintext.count + E2ERecord.overhead)
        let flags = final ? Self.finalFlag : 0
        output[0] = flags
        let ciphertext = UnsafeMutableRawBufferPointer(rebasing: output[1..<(1 + plaintext.count)])
        let tag = UnsafeMutableRawBufferPointer(
            rebasing: output[(1 + plaintext.count)..<(E2ERecord.overhead + plaintext.count)]
        )
        withNextNonce { nonce, key in
            #if canImport(CCryptoBoringSSL)
            Self.sealInPlace(plaintext, flags: flags, key: key, nonce: nonce, ciphertext: ciphertext, tag: tag)
            #else
            Self.sealWithSwiftAPI(plaintext, flags: flags, key: key, nonce: nonce, ciphertext: ciphertext, tag: tag)
            #endif
        }
    }

    /// Opens `record` (`flags ‖ ciphertext ‖ tag`) into `output`; returns whether it is the FINAL one.
    mutating func open(
        _ record: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws(ILSError) -> Bool {
        guard record.count >= E2ERecord.overhead, output.count >= record.count - E2ERecord.overhead,
            record[0] & ~Self.finalFlag == 0
        else { throw SecretStream.invalidRecord }
        let length = record.count - E2ERecord.overhead
        let ciphertext = UnsafeRawBufferPointer(rebasing: record[1..<(1 + length)])
        let tag = UnsafeRawBufferPointer(rebasing: record[(1 + length)...])
        let flags = UnsafeRawBufferPointer(rebasing: record[0..<1])
        let plaintext = UnsafeMutableRawBufferPointer(rebasing: output[..<length])
        let opened = withNextNonce { nonce, key in
            #if canImport(CCryptoBoringSSL)
            Self.openInPlace(ciphertext, tag: tag, flags: flags, key: key, nonce: nonce, into: plaintext)
            #else
            Self.openWithSwiftAPI(ciphertext, tag: tag, flags: flags, key: key, nonce: nonce, into: plaintext)
            #endif
        }
        guard opened else { throw SecretStream.invalidRecord }
        return record[0] == Self.finalFlag
    }
}

#if canImport(CCryptoBoringSSL)
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
    static func sealInPlace(
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
    static func openInPlace(
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

extension AESGCMRecords {
    /// Swift-crypto's Swift API, which is CryptoKit's on Apple systems: the sealed box is copied into the record.
    static func sealWithSwiftAPI(
        _ plaintext: UnsafeRawBufferPointer,
        flags: UInt8,
        key: SymmetricKey,
        nonce: UnsafeRawBufferPointer,
        ciphertext: UnsafeMutableRawBufferPointer,
        tag: UnsafeMutableRawBufferPointer
    ) {
        var flags = flags
        // A 12-byte nonce is always accepted, and sealing fails only for a key that is not 128, 192 or 256 bits.
        let box = withUnsafeBytes(of: &flags) { flags in
            try! AES.GCM.seal(plaintext, using: key, nonce: try! AES.GCM.Nonce(data: nonce), authenticating: flags)
        }
        box.ciphertext.withUnsafeBytes { ciphertext.copyMemory(from: $0) }
        box.tag.withUnsafeBytes { tag.copyMemory(from: $0) }
    }

    /// The Swift API's open, with the same copy out.
    static func openWithSwiftAPI(
        _ ciphertext: UnsafeRawBufferPointer,
        tag: UnsafeRawBufferPointer,
        flags: UnsafeRawBufferPointer,
        key: SymmetricKey,
        nonce: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) -> Bool {
        guard let nonce = try? AES.GCM.Nonce(data: nonce),
            let box = try? AES.GCM.SealedBox(nonce: nonce, ciphertext: ciphertext, tag: tag),
            let plaintext = try? AES.GCM.open(box, using: key, authenticating: flags)
        else { return false }
        plaintext.withUnsafeBytes { output.copyMemory(from: $0) }
        return true
    }
}
