package import Crypto
import Foundation
public import ILSCore

/// How an end-to-end circuit's records are protected, agreed in the handshake (docs/protocol.md, "Records").
///
/// Every suite adds the same 17 bytes to a record, binds each record to its position in the direction, and marks the
/// direction's last record FINAL, so the layers above don't depend on which one a circuit runs. Which versions may
/// agree which suite: `E2EHandshakeVersion.suites`.
public enum E2ESuite: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    /// libsodium's `crypto_secretstream_xchacha20poly1305`: the only suite of handshake version 1, and the one for a
    /// device without AES instructions (version 2). Implemented in ILSSodium.
    case xchacha20poly1305 = 1
    /// AES-256-GCM with a counter nonce, its iv and key changes derived with BLAKE2b: version 2's. ILSSodium.
    case aes256gcm = 2
    /// The same records as suite 2, the iv and key changes derived with HKDF-SHA256: version 3's, everywhere
    /// (swift-crypto: BoringSSL's VAES/AES-NI code on Linux, CryptoKit on Apple platforms).
    case aes256gcmHKDF = 3
    /// Suite 3's records, plus the CANCEL record (flags `0x02`): a device that offers it says that it ends a circuit
    /// it gives up on with a sealed CANCEL, so the gateway can tell a cancel from a path that was lost (a reset or a
    /// dead connection without it).
    case aes256gcmHKDFCancel = 4
    /// Suite 4's records, plus the ACK record (flags `0x04`): a lost path does not end the circuit; both ends hold it
    /// for a grace window and the device resumes it on a new path (docs/protocol.md, "Resuming a circuit"). Version
    /// 3's first choice.
    case aes256gcmHKDFResume = 5

    /// Whether the sender of this suite marks a cancel with the sealed CANCEL record.
    public var hasCancel: Bool { self == .aes256gcmHKDFCancel || self == .aes256gcmHKDFResume }

    /// Whether records are acknowledged (ACK) and the circuit outlives a lost path.
    public var isResumable: Bool { self == .aes256gcmHKDFResume }

    /// The bytes each side's handshake message carries for the direction it sends (secretstream's 24-byte header,
    /// `crypto_secretstream_xchacha20poly1305_HEADERBYTES`; AES-GCM needs none: its nonces come from the key).
    public var headerLength: Int {
        switch self {
        case .xchacha20poly1305: 24
        case .aes256gcm, .aes256gcmHKDF, .aes256gcmHKDFCancel, .aes256gcmHKDFResume: 0
        }
    }

    public var description: String {
        switch self {
        case .xchacha20poly1305: "xchacha20poly1305-secretstream"
        case .aes256gcm: "aes256gcm"
        case .aes256gcmHKDF: "aes256gcm-hkdf-sha256"
        case .aes256gcmHKDFCancel: "aes256gcm-hkdf-sha256-cancel"
        case .aes256gcmHKDFResume: "aes256gcm-hkdf-sha256-resume"
        }
    }
}

/// What every record adds to its plaintext, whichever the suite.
public enum E2ERecord {
    public static let overhead = 17
    /// How many AES-GCM records one key seals before both ends move to the next (see `AESGCMRecords`).
    public static let recordsPerKey: UInt64 = 1 << 20

    /// The refusal for a record that fails authentication (altered, reordered, replayed, after FINAL).
    public static let invalidRecord = ILSError(
        .e2eRecordInvalid,
        "an end-to-end record failed authentication; the circuit was tampered with and is closed"
    )
}

/// A record protection implemented outside this module (libsodium's secretstream, in ILSSodium), behind the same
/// seal-into and open-into calls as the AES-GCM suites.
package protocol E2ERecordSealing: AnyObject {
    /// What the receiver needs first, sent in this side's handshake message.
    var header: [UInt8] { get }
    func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, final: Bool)
}

package protocol E2ERecordOpening: AnyObject {
    func open(_ record: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws(ILSError) -> Bool
}

/// The sending half of a circuit's records. Keeps the AES-GCM state inline (the suites every current device uses),
/// since a gateway keeps one pair per open stream.
public final class E2ERecordSender {
    private var gcm: AESGCMRecords?
    private let other: (any E2ERecordSealing)?
    public let suite: E2ESuite
    /// What the receiver needs first (`suite.headerLength` bytes), sent in this side's handshake message.
    public var header: [UInt8] { other?.header ?? [] }

    package init(suite: E2ESuite, gcm: AESGCMRecords) {
        self.suite = suite
        self.gcm = gcm
        self.other = nil
    }

    package init(suite: E2ESuite, sealer: any E2ERecordSealing) {
        self.suite = suite
        self.gcm = nil
        self.other = sealer
    }

    /// Seals `plaintext` straight into `output` (at least `plaintext.count + E2ERecord.overhead` bytes).
    public func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, final: Bool) {
        if let other {
            other.seal(plaintext, into: output, final: final)
        } else {
            gcm!.seal(plaintext, into: output, final: final)
        }
    }

    /// Seals the CANCEL record (empty, flags `0x02`) into `output` (at least `E2ERecord.overhead` bytes): the
    /// direction's last record, meaning "I gave up". Only suites with `hasCancel`.
    public func sealCancel(into output: UnsafeMutableRawBufferPointer) {
        precondition(suite.hasCancel && gcm != nil, "suite \(suite) has no CANCEL record")
        gcm!.seal(UnsafeRawBufferPointer(start: nil, count: 0), into: output, flags: AESGCMRecords.cancelFlag)
    }

    /// Seals an ACK record (suite 5): "I have opened `count` of your records", 8 bytes big-endian, flags `0x04`.
    public func sealAck(_ count: UInt64, into output: UnsafeMutableRawBufferPointer) {
        precondition(suite.isResumable && gcm != nil, "suite \(suite) has no ACK record")
        withUnsafeBytes(of: count.bigEndian) { plaintext in
            gcm!.seal(plaintext, into: output, flags: AESGCMRecords.ackFlag)
        }
    }

    /// Seals an ACK record into a new array.
    public func sealAck(_ count: UInt64) -> [UInt8] {
        var record = [UInt8](repeating: 0, count: E2ERecord.overhead + 8)
        record.withUnsafeMutableBytes { sealAck(count, into: $0) }
        return record
    }

    /// Seals the CANCEL record into a new array.
    public func sealCancel() -> [UInt8] {
        var record = [UInt8](repeating: 0, count: E2ERecord.overhead)
        record.withUnsafeMutableBytes { sealCancel(into: $0) }
        return record
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
    private var gcm: AESGCMRecords?
    private let other: (any E2ERecordOpening)?
    /// Set by the first refusal: nothing opens after it.
    private var spent = false
    public let suite: E2ESuite
    /// Whether the FINAL or CANCEL record has been opened; nothing opens after it.
    public private(set) var finished = false
    /// Whether that last record was CANCEL: the peer gave up (suites with `hasCancel` only).
    public private(set) var cancelled = false
    /// After `open`: the count the record acknowledged if it was an ACK (suite 5), else `nil`. An ACK is no data:
    /// its 8 bytes of plaintext are the count, not the stream's.
    public private(set) var acknowledged: UInt64?

    package init(suite: E2ESuite, gcm: AESGCMRecords) {
        self.suite = suite
        self.gcm = gcm
        self.other = nil
    }

    package init(suite: E2ESuite, opener: any E2ERecordOpening) {
        self.suite = suite
        self.gcm = nil
        self.other = opener
    }

    /// Opens `record` straight into `output` (at least `record.count - E2ERecord.overhead` bytes); returns whether it
    /// was the direction's last record: FINAL, or CANCEL (then `cancelled` is set). Throws if it was altered, reordered, replayed, spliced, or comes after the final one; a
    /// receiver that threw opens nothing more.
    public func open(_ record: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer) throws(ILSError)
        -> Bool
    {
        // After FINAL only an ACK may come (suite 5): the peer still acknowledges what this end sends.
        guard !spent, !finished || (suite.isResumable && record.count > 0 && record[0] == AESGCMRecords.ackFlag)
        else { throw E2ERecord.invalidRecord }
        acknowledged = nil
        let final: Bool
        do throws(ILSError) {
            if let other {
                final = try other.open(record, into: output)
            } else {
                let flags = try gcm!.open(record, into: output)
                final = flags == AESGCMRecords.finalFlag || flags == AESGCMRecords.cancelFlag
                cancelled = flags == AESGCMRecords.cancelFlag
                acknowledged =
                    flags == AESGCMRecords.ackFlag
                    ? UnsafeRawBufferPointer(output).loadUnaligned(as: UInt64.self).bigEndian : nil
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
        guard record.count >= E2ERecord.overhead else { throw E2ERecord.invalidRecord }
        var plaintext = [UInt8](repeating: 0, count: record.count - E2ERecord.overhead)
        let final = record.withUnsafeBytes { input in
            plaintext.withUnsafeMutableBytes { output in
                Result { () throws(ILSError) in try open(input, into: output) }
            }
        }
        return (plaintext, try final.get())
    }
}

/// How an AES-GCM suite derives its records' iv from a direction key and the next key at a key change.
package struct AESGCMKeySchedule: Sendable {
    /// The 12-byte iv for records under `key`.
    let iv: @Sendable ([UInt8]) -> [UInt8]
    /// The key after `key`, at every `recordsPerKey` records.
    let next: @Sendable ([UInt8]) -> [UInt8]

    package init(iv: @escaping @Sendable ([UInt8]) -> [UInt8], next: @escaping @Sendable ([UInt8]) -> [UInt8]) {
        self.iv = iv
        self.next = next
    }

    /// Suite 3: `iv = HKDF-SHA256(ikm = key, salt = none, info = "ils-e2e-v3 iv", L = 12)` and
    /// `next key = HKDF-SHA256(ikm = key, salt = none, info = "ils-e2e-v3 rekey", L = 32)` (RFC 5869; no salt means
    /// 32 zero bytes).
    package static let hkdf = AESGCMKeySchedule(
        iv: { derive($0, "ils-e2e-v3 iv", 12) },
        next: { derive($0, "ils-e2e-v3 rekey", AESGCMRecords.keyLength) }
    )

    private static func derive(_ key: [UInt8], _ info: String, _ length: Int) -> [UInt8] {
        HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: key),
            info: Array(info.utf8),
            outputByteCount: length
        ).withUnsafeBytes { Array($0) }
    }
}

/// One direction of AES-256-GCM records: `u8 flags ‖ ciphertext ‖ 16-byte tag`, flags `0x01` on the FINAL record and
/// `0x00` otherwise, authenticated as the additional data.
///
/// The nonce of record `n` (counting from 0 for the whole direction, across key changes) is `iv XOR (0⁴ ‖ u64 n)`,
/// where `iv` comes from the direction's first key by the suite's `AESGCMKeySchedule` and stays the same after a key
/// change: a receiver that opens a record at any other position than the sender sealed it fails the tag, which is
/// what refuses reordering, replay, dropping and splicing. The key is unique to the circuit and direction (the
/// handshake's ephemeral keys and nonces go into it), so no nonce repeats under a key. After every `recordsPerKey`
/// records both ends replace the key with the schedule's next one, keeping the data under one key (at most 2²⁰
/// records of 64 KiB, 2³² AES blocks) far below where GCM's confidentiality bound starts to matter, however long a
/// circuit lives.
package struct AESGCMRecords {
    package static let keyLength = 32
    /// Which AEAD code seals and opens: BoringSSL's in place on Linux, swift-crypto's Swift API (CryptoKit's) on Apple
    /// platforms and in the `AppleCodePath` build.
    ///
    /// On Linux, `ILS_AEAD=swift-crypto-api` in a process's environment selects the Swift API at run time, read once.
    /// CI runs the device side's tests that way on the ordinary build instead of building the whole package a second
    /// time with the trait (docs/testing.md); the trait build, of ILSClient's closure only, proves that the code
    /// compiles without the in-place file. Any other value stops the process: a misspelt switch must not quietly test
    /// the other path.
    #if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
    package static let backend: String = {
        switch ProcessInfo.processInfo.environment["ILS_AEAD"] {
        case nil, "", "boringssl-in-place": return "boringssl-in-place"
        case "swift-crypto-api": return "swift-crypto-api"
        case let other?: fatalError("ILS_AEAD=\(other): the AEAD path is boringssl-in-place or swift-crypto-api")
        }
    }()
    static let sealsInPlace = backend == "boringssl-in-place"
    #else
    package static let backend = "swift-crypto-api"
    #endif
    static let finalFlag: UInt8 = 0x01
    /// The CANCEL record's flags (`E2ESuite.hasCancel`): empty, the direction's last, "the peer gave up".
    static let cancelFlag: UInt8 = 0x02
    /// The ACK record's flags (`E2ESuite.isResumable`): 8 bytes, the count of the peer's records opened so far.
    static let ackFlag: UInt8 = 0x04

    private var key: SymmetricKey
    /// The IV's first 4 bytes and last 8, big-endian: the nonce of record `n` is `ivHead ‖ (ivTail XOR n)`.
    private let ivHead: UInt32
    private let ivTail: UInt64
    private var counter: UInt64 = 0
    private let recordsPerKey: UInt64
    private let schedule: AESGCMKeySchedule

    /// Which record flags this direction accepts besides `0x00`: FINAL, and CANCEL where the suite has it.
    private let acceptedFlags: Set<UInt8>

    package init(
        key: [UInt8],
        schedule: AESGCMKeySchedule,
        recordsPerKey: UInt64,
        cancel: Bool = false,
        ack: Bool = false
    ) {
        precondition(key.count == Self.keyLength && recordsPerKey > 0)
        self.acceptedFlags = Set([0, Self.finalFlag] + (cancel ? [Self.cancelFlag] : []) + (ack ? [Self.ackFlag] : []))
        self.key = SymmetricKey(data: key)
        let iv = schedule.iv(key)
        self.ivHead = iv[0..<4].reduce(0) { $0 << 8 | UInt32($1) }
        self.ivTail = iv[4..<12].reduce(0) { $0 << 8 | UInt64($1) }
        self.recordsPerKey = recordsPerKey
        self.schedule = schedule
    }

    /// Moves to the next record: to the next key first when the current one has sealed its share. Returns the
    /// record's nonce, `iv XOR (0⁴ ‖ u64 n)`, as its first 4 bytes and last 8 (big-endian).
    private mutating func advance() -> (head: UInt32, tail: UInt64) {
        // 2⁶⁴ records would take centuries at any rate a machine can seal them.
        precondition(counter < UInt64.max, "end-to-end record counter exhausted")
        if counter > 0, counter % recordsPerKey == 0 {
            key = SymmetricKey(data: schedule.next(key.withUnsafeBytes { Array($0) }))
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
        seal(plaintext, into: output, flags: final ? Self.finalFlag : 0)
    }

    mutating func seal(_ plaintext: UnsafeRawBufferPointer, into output: UnsafeMutableRawBufferPointer, flags: UInt8) {
        precondition(output.count >= plaintext.count + E2ERecord.overhead)
        output[0] = flags
        let ciphertext = UnsafeMutableRawBufferPointer(rebasing: output[1..<(1 + plaintext.count)])
        let tag = UnsafeMutableRawBufferPointer(
            rebasing: output[(1 + plaintext.count)..<(E2ERecord.overhead + plaintext.count)]
        )
        withNextNonce { nonce, key in
            #if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
            if Self.sealsInPlace {
                Self.sealInPlace(plaintext, flags: flags, key: key, nonce: nonce, ciphertext: ciphertext, tag: tag)
                return
            }
            #endif
            Self.sealWithSwiftAPI(plaintext, flags: flags, key: key, nonce: nonce, ciphertext: ciphertext, tag: tag)
        }
    }

    /// Opens `record` (`flags ‖ ciphertext ‖ tag`) into `output`; returns its flags (`0`, FINAL, or CANCEL where the
    /// suite has it).
    mutating func open(
        _ record: UnsafeRawBufferPointer,
        into output: UnsafeMutableRawBufferPointer
    ) throws(ILSError) -> UInt8 {
        guard record.count >= E2ERecord.overhead, output.count >= record.count - E2ERecord.overhead,
            acceptedFlags.contains(record[0]),
            record[0] != Self.cancelFlag || record.count == E2ERecord.overhead,
            record[0] != Self.ackFlag || record.count == E2ERecord.overhead + 8
        else { throw E2ERecord.invalidRecord }
        let length = record.count - E2ERecord.overhead
        let ciphertext = UnsafeRawBufferPointer(rebasing: record[1..<(1 + length)])
        let tag = UnsafeRawBufferPointer(rebasing: record[(1 + length)...])
        let flags = UnsafeRawBufferPointer(rebasing: record[0..<1])
        let plaintext = UnsafeMutableRawBufferPointer(rebasing: output[..<length])
        let opened = withNextNonce { nonce, key in
            #if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
            if Self.sealsInPlace {
                return Self.openInPlace(ciphertext, tag: tag, flags: flags, key: key, nonce: nonce, into: plaintext)
            }
            #endif
            return Self.openWithSwiftAPI(ciphertext, tag: tag, flags: flags, key: key, nonce: nonce, into: plaintext)
        }
        guard opened else { throw E2ERecord.invalidRecord }
        return record[0]
    }
}

extension AESGCMRecords {
    /// Swift-crypto's Swift API, which is CryptoKit's on Apple systems: the sealed box is copied into the record.
    package static func sealWithSwiftAPI(
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
    package static func openWithSwiftAPI(
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
