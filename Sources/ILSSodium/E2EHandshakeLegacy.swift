public import Crypto
public import ILSCore
public import ILSCrypto

/// Handshake versions 1 and 2, which hash with BLAKE2b (libsodium's `crypto_generichash`) and so cannot be built on
/// CryptoKit: gateways still answer them so that devices built before version 3 keep working (docs/protocol.md).
///
/// - transcript: `BLAKE2b-256(transcriptInput)`, unkeyed;
/// - keys: libsodium's `crypto_kx` from the X25519 shared secret `q`, `h = BLAKE2b-512(q ‖ initiator ephemeral ‖
///   responder ephemeral)`, responder → initiator `h[0..<32]` and initiator → responder `h[32..<64]`, each then
///   bound to the transcript as `BLAKE2b-256(key = that key, transcript)`;
/// - records: version 1 only secretstream (suite 1, no list on the wire); version 2 suite 2 or 1.
public struct E2EHandshakeLegacy: E2EHandshakeVersion {
    public let number: UInt8

    /// Version 1 or 2.
    public init(_ number: UInt8) {
        precondition(number == 1 || number == 2, "the legacy handshake versions are 1 and 2")
        self.number = number
    }

    public var suites: [E2ESuite] { number == 1 ? [.xchacha20poly1305] : [.aes256gcm, .xchacha20poly1305] }

    public func transcript(_ parts: [[UInt8]]) -> [UInt8] {
        Sodium.blake2b(E2EHandshake.transcriptInput(version: number, parts), length: 32)
    }

    public func keys(
        sharedSecret: SharedSecret,
        initiatorEphemeral: [UInt8],
        responderEphemeral: [UInt8],
        transcript: [UInt8]
    ) -> E2EDirectionKeys {
        let q = sharedSecret.withUnsafeBytes { Array($0) }
        let h = Sodium.blake2b(q + initiatorEphemeral + responderEphemeral, length: 64)
        return E2EDirectionKeys(
            initiatorToResponder: Sodium.blake2b(transcript, key: Array(h[32..<64]), length: 32),
            responderToInitiator: Sodium.blake2b(transcript, key: Array(h[0..<32]), length: 32)
        )
    }

    public func sender(suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64) -> E2ERecordSender {
        precondition(suites.contains(suite), "version \(number) does not agree suite \(suite.rawValue)")
        return E2ERecordSuites.sender(suite, key: key, recordsPerKey: recordsPerKey)
    }

    public func receiver(suite: E2ESuite, key: [UInt8], header: [UInt8], recordsPerKey: UInt64) throws(ILSError)
        -> E2ERecordReceiver
    {
        guard suites.contains(suite) else { throw E2ERecord.invalidRecord }
        return try E2ERecordSuites.receiver(suite, key: key, header: header, recordsPerKey: recordsPerKey)
    }
}

/// Every handshake version, for gateways: what they answer.
public enum E2EHandshakeVersions {
    public static let all: [any E2EHandshakeVersion] = [E2EHandshakeLegacy(1), E2EHandshakeLegacy(2), E2EHandshakeV3()]
}

/// The records of every suite by number, whichever handshake agreed it: for the versions above and for the fuzz
/// targets, which drive the record layer directly.
public enum E2ERecordSuites {
    /// Suite 2's iv and key change: `iv = BLAKE2b-128(key = direction key, "ils-e2e-v2 iv")[0..<12]`, next key
    /// `BLAKE2b-256(key = key, "ils-e2e-v2 rekey")`.
    static let blake2b = AESGCMKeySchedule(
        iv: { Array(Sodium.blake2b(Array("ils-e2e-v2 iv".utf8), key: $0, length: 16)[0..<12]) },
        next: { Sodium.blake2b(Array("ils-e2e-v2 rekey".utf8), key: $0, length: 32) }
    )

    public static func sender(
        _ suite: E2ESuite,
        key: [UInt8],
        recordsPerKey: UInt64 = E2ERecord.recordsPerKey
    ) -> E2ERecordSender {
        switch suite {
        case .xchacha20poly1305:
            E2ERecordSender(suite: suite, sealer: SecretStreamSender(key: key))
        case .aes256gcm:
            E2ERecordSender(suite: suite, gcm: AESGCMRecords(key: key, schedule: blake2b, recordsPerKey: recordsPerKey))
        case .aes256gcmHKDF, .aes256gcmHKDFCancel, .aes256gcmHKDFResume:
            E2EHandshakeV3().sender(suite: suite, key: key, recordsPerKey: recordsPerKey)
        }
    }

    public static func receiver(
        _ suite: E2ESuite,
        key: [UInt8],
        header: [UInt8],
        recordsPerKey: UInt64 = E2ERecord.recordsPerKey
    ) throws(ILSError) -> E2ERecordReceiver {
        switch suite {
        case .xchacha20poly1305:
            return E2ERecordReceiver(suite: suite, opener: try SecretStreamReceiver(key: key, header: header))
        case .aes256gcm:
            guard header.isEmpty, key.count == AESGCMRecords.keyLength else { throw E2ERecord.invalidRecord }
            return E2ERecordReceiver(
                suite: suite,
                gcm: AESGCMRecords(key: key, schedule: blake2b, recordsPerKey: recordsPerKey)
            )
        case .aes256gcmHKDF, .aes256gcmHKDFCancel, .aes256gcmHKDFResume:
            return try E2EHandshakeV3().receiver(suite: suite, key: key, header: header, recordsPerKey: recordsPerKey)
        }
    }
}
