public import Crypto
public import ILSCore

/// What one version of the end-to-end handshake decides: how the transcript is hashed, how the two directions' keys
/// come from the X25519 shared secret, and which record suites it may agree. The messages, the certificate checks and
/// the signatures are the same in every version (`E2EInitiator`, `E2EResponder`).
///
/// Version 3 (`E2EHandshakeV3`, here) uses only what CryptoKit has, so the device side builds for Apple platforms
/// without libsodium. Versions 1 and 2 hash with BLAKE2b, which CryptoKit lacks; they live in ILSSodium, which
/// gateways link so that devices built before version 3 keep working.
public protocol E2EHandshakeVersion: Sendable {
    /// The byte in both hellos, and the `N` in the transcript's `ils-e2e-vN` label.
    var number: UInt8 { get }
    /// The record suites this version may agree, in the order a device using it offers them.
    var suites: [E2ESuite] { get }
    /// The transcript digest over the length-prefixed parts (`E2EHandshake.transcriptInput`).
    func transcript(_ parts: [[UInt8]]) -> [UInt8]
    /// The two directions' 32-byte record keys from the X25519 shared secret, both ephemeral public keys and the
    /// transcript.
    func keys(
        sharedSecret: SharedSecret,
        initiatorEphemeral: [UInt8],
        responderEphemeral: [UInt8],
        transcript: [UInt8]
    ) -> E2EDirectionKeys
    /// The sending half of `suite` keyed with `key`.
    func sender(suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64) -> E2ERecordSender
    /// The receiving half of `suite`; `header` is what the peer's handshake message carried.
    func receiver(suite: E2ESuite, key: [UInt8], header: [UInt8], recordsPerKey: UInt64) throws(ILSError)
        -> E2ERecordReceiver
}

extension E2EHandshakeVersion {
    /// Version 1 carries no suite list or choice on the wire; every later version does.
    var negotiatesSuite: Bool { number > 1 }
}

/// One key per direction of a circuit.
public struct E2EDirectionKeys {
    public let initiatorToResponder: [UInt8]
    public let responderToInitiator: [UInt8]

    public init(initiatorToResponder: [UInt8], responderToInitiator: [UInt8]) {
        self.initiatorToResponder = initiatorToResponder
        self.responderToInitiator = responderToInitiator
    }
}

/// Handshake version 3: SHA-256 and HKDF-SHA256 (RFC 5869), X25519, AES-256-GCM; all in CryptoKit and swift-crypto.
///
/// - transcript: `SHA-256(u32 len ‖ "ils-e2e-v3" ‖ u32 len ‖ part ‖ …)`, the parts in the order of versions 1 and 2;
/// - keys: `HKDF-SHA256(ikm = X25519 shared secret, salt = transcript, info = "ils-e2e-v3 initiator" or
///   "ils-e2e-v3 responder", L = 32)`, one per sending side. The salt binds both keys to the whole transcript (both
///   certificates, both ephemeral keys, both nonces, the service and the suites), which both ends sign;
/// - records: suite 5 (suite 4's records plus ACK, resumable: `E2ESuite.aes256gcmHKDFResume`), or, for a gateway of
///   an earlier release, suite 4 (suite 3's records plus CANCEL, `E2ESuite.aes256gcmHKDFCancel`) or suite 3,
///   AES-256-GCM with its iv and key changes derived by HKDF (`E2ESuite.aes256gcmHKDF`).
public struct E2EHandshakeV3: E2EHandshakeVersion {
    public init() {}

    public var number: UInt8 { 3 }
    public var suites: [E2ESuite] { [.aes256gcmHKDFResume, .aes256gcmHKDFCancel, .aes256gcmHKDF] }

    public func transcript(_ parts: [[UInt8]]) -> [UInt8] {
        Array(SHA256.hash(data: E2EHandshake.transcriptInput(version: number, parts)))
    }

    public func keys(
        sharedSecret: SharedSecret,
        initiatorEphemeral: [UInt8],
        responderEphemeral: [UInt8],
        transcript: [UInt8]
    ) -> E2EDirectionKeys {
        // One extract, two expands: the same bytes as two full HKDF calls, at half the HMACs for the extract.
        let pseudoRandomKey = HKDF<SHA256>.extract(
            inputKeyMaterial: SymmetricKey(data: sharedSecret.withUnsafeBytes { Array($0) }),
            salt: transcript
        )
        func key(_ info: String) -> [UInt8] {
            HKDF<SHA256>.expand(pseudoRandomKey: pseudoRandomKey, info: Array(info.utf8), outputByteCount: 32)
                .withUnsafeBytes { Array($0) }
        }
        return E2EDirectionKeys(
            initiatorToResponder: key("ils-e2e-v3 initiator"),
            responderToInitiator: key("ils-e2e-v3 responder")
        )
    }

    /// One direction's AES-GCM records under `suite`'s flags (CANCEL from suite 4, ACK from suite 5).
    private static func records(_ suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64) -> AESGCMRecords {
        AESGCMRecords(
            key: key,
            schedule: .hkdf,
            recordsPerKey: recordsPerKey,
            cancel: suite.hasCancel,
            ack: suite.isResumable
        )
    }

    public func sender(suite: E2ESuite, key: [UInt8], recordsPerKey: UInt64) -> E2ERecordSender {
        precondition(suites.contains(suite), "version 3 agrees only suites 5, 4 and 3")
        return E2ERecordSender(
            suite: suite,
            gcm: Self.records(suite, key: key, recordsPerKey: recordsPerKey)
        )
    }

    public func receiver(suite: E2ESuite, key: [UInt8], header: [UInt8], recordsPerKey: UInt64) throws(ILSError)
        -> E2ERecordReceiver
    {
        guard suites.contains(suite), header.isEmpty, key.count == AESGCMRecords.keyLength else {
            throw E2ERecord.invalidRecord
        }
        return E2ERecordReceiver(
            suite: suite,
            gcm: Self.records(suite, key: key, recordsPerKey: recordsPerKey)
        )
    }
}
