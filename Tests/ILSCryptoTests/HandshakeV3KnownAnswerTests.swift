import Crypto
import Foundation
import ILSCore
import Testing

@testable import ILSCrypto

/// Version 3's derivations against answers computed with another implementation (Python's `cryptography`: X25519,
/// HKDF, AESGCM, and `hashlib.sha256`, following docs/protocol.md alone), so a compatible client can check itself.
@Suite("Handshake version 3 known answers")
struct HandshakeV3KnownAnswerTests {
    static func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

    @Test("the transcript is SHA-256 of the length-prefixed parts, and the keys HKDF-SHA256 salted with it")
    func keySchedule() throws {
        let device = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: [UInt8](repeating: 1, count: 32))
        let gateway = try Curve25519.KeyAgreement.PrivateKey(rawRepresentation: [UInt8](repeating: 2, count: 32))
        let version = E2EHandshakeV3()
        let transcript = version.transcript([Array("claude-api".utf8), Array("dev".utf8), Array("gw".utf8)])
        #expect(Self.hex(transcript) == "9bcd00eb4fe8ec3b92c074511becac40a87b701844ea0c54b879a9f87e7dd6d2")
        let keys = version.keys(
            sharedSecret: try device.sharedSecretFromKeyAgreement(with: gateway.publicKey),
            initiatorEphemeral: Array(device.publicKey.rawRepresentation),
            responderEphemeral: Array(gateway.publicKey.rawRepresentation),
            transcript: transcript
        )
        #expect(
            Self.hex(keys.initiatorToResponder) == "c67f4787d4513ca8f9bf14b4762c2d0c168cf37af021335d65016d6b0666354f"
        )
        #expect(
            Self.hex(keys.responderToInitiator) == "924e4943304ffd64ad972352f9a1c9709631cc7a3d5ac55c82e6eabc996c6e39"
        )
    }

    @Test("suite 3 records match, across a key change (iv and next key from HKDF-SHA256)")
    func records() throws {
        let key = [UInt8](repeating: 0x11, count: 32)
        let sender = E2EHandshakeV3().sender(suite: .aes256gcmHKDF, key: key, recordsPerKey: 2)
        // FINAL last, as a sender must send it; the third record is sealed under the changed key.
        let records = [sender.seal(Array("hi".utf8)), sender.seal(Array("x".utf8)), sender.seal([], final: true)]
        #expect(
            records.map(Self.hex) == [
                "0004d92e3162621fa6261d133e3e724f33bcd6", "00028524f148b0bd03a9b30b389be0d0ed0a",
                "0138dde279f4b2f2df93ecb2f8e73935e9",
            ]
        )
        let receiver = try E2EHandshakeV3().receiver(suite: .aes256gcmHKDF, key: key, header: [], recordsPerKey: 2)
        #expect(try receiver.open(records[0]).plaintext == Array("hi".utf8))
        #expect(try receiver.open(records[1]).plaintext == Array("x".utf8))
        #expect(try receiver.open(records[2]).final)
    }

    @Test("suite 4: the CANCEL record's known answer; it is empty, the direction's last, and suite 3 refuses it")
    func cancelRecord() throws {
        let key = [UInt8](repeating: 0x11, count: 32)
        let sender = E2EHandshakeV3().sender(suite: .aes256gcmHKDFCancel, key: key, recordsPerKey: 2)
        let records = [sender.seal(Array("hi".utf8)), sender.sealCancel()]
        // The same bytes as suite 3 for a data record: suite 4 changes no record that suite 3 has.
        #expect(Self.hex(records[0]) == "0004d92e3162621fa6261d133e3e724f33bcd6")
        #expect(Self.hex(records[1]) == "025669cd508feeb54c6b205378152c9202")
        let receiver = try E2EHandshakeV3().receiver(
            suite: .aes256gcmHKDFCancel,
            key: key,
            header: [],
            recordsPerKey: 2
        )
        #expect(try receiver.open(records[0]).plaintext == Array("hi".utf8))
        let cancel = try receiver.open(records[1])
        #expect(cancel.final && cancel.plaintext.isEmpty && receiver.cancelled)
        #expect(throws: ILSError.self) { _ = try receiver.open(sender.seal(Array("x".utf8))) }
        // Suite 3 has no CANCEL: the record is refused.
        let old = try E2EHandshakeV3().receiver(suite: .aes256gcmHKDF, key: key, header: [], recordsPerKey: 2)
        _ = try old.open(records[0])
        #expect(throws: ILSError.self) { _ = try old.open(records[1]) }
    }
}

extension HandshakeV3KnownAnswerTests {
    @Test("suite 5: the ACK record's known answer; it carries its count, may follow FINAL, and suite 4 refuses it")
    func ackRecord() throws {
        let key = [UInt8](repeating: 0x11, count: 32)
        let sender = E2EHandshakeV3().sender(suite: .aes256gcmHKDFResume, key: key, recordsPerKey: 2)
        let records = [sender.seal(Array("hi".utf8)), sender.sealAck(1)]
        #expect(Self.hex(records[0]) == "0004d92e3162621fa6261d133e3e724f33bcd6")
        #expect(Self.hex(records[1]) == "047a4e9d040adc086e2410bc2fe063b3ee103dec24f00ead13")
        let receiver = try E2EHandshakeV3().receiver(
            suite: .aes256gcmHKDFResume,
            key: key,
            header: [],
            recordsPerKey: 2
        )
        #expect(try receiver.open(records[0]).plaintext == Array("hi".utf8) && receiver.acknowledged == nil)
        let ack = try receiver.open(records[1])
        #expect(!ack.final && receiver.acknowledged == 1)
        // After FINAL the peer may still acknowledge; nothing else may follow.
        #expect(try receiver.open(sender.seal([], final: true)).final)
        _ = try receiver.open(sender.sealAck(2))
        #expect(receiver.acknowledged == 2)
        #expect(throws: ILSError.self) { _ = try receiver.open(sender.seal(Array("x".utf8))) }
        // Suite 4 has no ACK.
        let old = try E2EHandshakeV3().receiver(suite: .aes256gcmHKDFCancel, key: key, header: [], recordsPerKey: 2)
        _ = try old.open(records[0])
        #expect(throws: ILSError.self) { _ = try old.open(records[1]) }
    }

    @Test("resumption: the circuit id and key from the direction keys, and RESUME and RESUMED known answers")
    func resumeMessages() throws {
        let keys = E2EDirectionKeys(
            initiatorToResponder: Self.bytes("c67f4787d4513ca8f9bf14b4762c2d0c168cf37af021335d65016d6b0666354f"),
            responderToInitiator: Self.bytes("924e4943304ffd64ad972352f9a1c9709631cc7a3d5ac55c82e6eabc996c6e39")
        )
        let secrets = E2EResumeSecrets(keys: keys)
        #expect(Self.hex(secrets.circuitID) == "ef769db71b221309a4bb4e4a9f286f99")
        let request = E2EResumeMessage(kind: .request, circuitID: secrets.circuitID, attempt: 1, received: 5)
            .sealed(with: secrets)
        #expect(
            Self.hex(request)
                == "5201ef769db71b221309a4bb4e4a9f286f99000000010000000000000005"
                + "e825d055c7fbfb02bbe89607ad6de739140d5b22df5e4caea7a353e0260565fa"
        )
        let answer = E2EResumeMessage(kind: .answer, circuitID: secrets.circuitID, attempt: 1, received: 7)
            .sealed(with: secrets)
        #expect(
            Self.hex(answer)
                == "5301ef769db71b221309a4bb4e4a9f286f9900000001000000000000000753ca943d314df8681cc8d416a634783654aa9853d378f03fc1b8ae5742a4b709"
        )
        let parsed = try E2EResumeMessage.parse(request)
        #expect(parsed.attempt == 1 && parsed.received == 5 && parsed.kind == .request && parsed.verify(with: secrets))
        // One bit changed anywhere, or another circuit's key: not verified.
        var altered = request
        altered[25] ^= 1
        #expect(!(try E2EResumeMessage.parse(altered)).verify(with: secrets))
        let other = E2EResumeSecrets(
            keys: E2EDirectionKeys(
                initiatorToResponder: keys.responderToInitiator,
                responderToInitiator: keys.initiatorToResponder
            )
        )
        #expect(!parsed.verify(with: other))
        #expect(throws: ILSError.self) { _ = try E2EResumeMessage.parse(Array(request.dropLast())) }
    }

    static func bytes(_ hex: String) -> [UInt8] {
        var out: [UInt8] = []
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            out.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        return out
    }
}

@Suite("The build's AEAD path")
struct AEADPathTests {
    /// CI runs the device side's suites a second time with `ILS_AEAD=swift-crypto-api` (deploy/apple-path.sh); this
    /// fails if the switch, or the `AppleCodePath` trait, stops moving the records to the code Apple platforms run.
    @Test(
        "records take the Swift API path in the AppleCodePath build or with ILS_AEAD=swift-crypto-api, BoringSSL's otherwise"
    )
    func backendMatchesTheBuild() {
        #if ILS_APPLE_CODE_PATH || !canImport(CCryptoBoringSSL)
        #expect(AESGCMRecords.backend == "swift-crypto-api")
        #else
        let expected =
            ProcessInfo.processInfo.environment["ILS_AEAD"] == "swift-crypto-api"
            ? "swift-crypto-api" : "boringssl-in-place"
        #expect(AESGCMRecords.backend == expected)
        #endif
    }

    #if canImport(CCryptoBoringSSL) && !ILS_APPLE_CODE_PATH
    /// A misspelt switch must not quietly test the other path: CI's Apple-path stage would then prove nothing.
    @Test("an ILS_AEAD other than the two paths stops the process instead of sealing with either")
    func unknownPathStops() async {
        await #expect(processExitsWith: .failure) {
            setenv("ILS_AEAD", "swift-crypto", 1)
            _ = AESGCMRecords.backend
        }
    }
    #endif
}
