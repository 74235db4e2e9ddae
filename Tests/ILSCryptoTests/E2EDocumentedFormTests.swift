import CSodium
import Crypto
import Foundation
import ILSCore
import ILSCrypto
import ILSSodium
import Testing

/// The handshake transcript and the AES-GCM nonces, computed from docs/protocol.md's words alone and compared with
/// what the code signs and seals: a device written from the text must get the same bytes.
@Suite("End-to-end forms as documented")
struct E2EDocumentedFormTests {
    /// BLAKE2b (RFC 7693) of `message`, `length` bytes, keyed with `key` when given: libsodium's crypto_generichash.
    static func blake2b(_ message: [UInt8], key: [UInt8]? = nil, length: Int) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: length)
        _ = crypto_generichash(&out, length, message, UInt64(message.count), key, key?.count ?? 0)
        return out
    }

    /// Reads the documented message layouts: `u8`, fixed fields, and `var` (u16 length, big-endian).
    struct Reader {
        var bytes: ArraySlice<UInt8>
        mutating func u8() -> UInt8 { bytes.removeFirst() }
        mutating func fixed(_ count: Int) -> [UInt8] {
            defer { bytes = bytes.dropFirst(count) }
            return Array(bytes.prefix(count))
        }
        mutating func variable() -> [UInt8] {
            let length = Int(u8()) << 8 | Int(u8())
            return fixed(length)
        }
    }

    /// `I = for each part p: u32(len p) ‖ p`; `T = SHA-256(I)` in version 3, `BLAKE2b-256(I)` in versions 1 and 2.
    static func transcript(_ parts: [[UInt8]], version: UInt8) -> [UInt8] {
        var input: [UInt8] = []
        for part in parts {
            withUnsafeBytes(of: UInt32(part.count).bigEndian) { input += $0 }
            input += part
        }
        return version == 3 ? Array(SHA256.hash(data: input)) : blake2b(input, length: 32)
    }

    /// `HKDF-SHA256(IKM = key, no salt, info, L)`.
    static func hkdf(_ key: [UInt8], _ info: String, _ length: Int) -> [UInt8] {
        HKDF<SHA256>.deriveKey(
            inputKeyMaterial: SymmetricKey(data: key),
            info: Array(info.utf8),
            outputByteCount: length
        ).withUnsafeBytes { Array($0) }
    }

    @Test(
        "the gateway signs the transcript built from the documented parts, with the bare identity ids",
        arguments: [UInt8(2), 3]
    )
    func transcriptUsesBareIDs(version: UInt8) throws {
        let parties = try E2EParties()
        let speaking = E2EHandshakeVersions.all.first { $0.number == version }!
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api", version: speaking)
        let clientHello = initiator.clientHello()
        let responder = E2EResponder(credentials: parties.gateway, versions: E2EHandshakeVersions.all)
        let (serverHello, _, _) = try responder.receiveClientHello(clientHello)

        var hello = Reader(bytes: clientHello[...])
        #expect(hello.u8() == 1 && hello.u8() == version)
        let service = hello.variable()
        let deviceCertificate = hello.variable()
        let deviceEphemeral = hello.fixed(32)
        let deviceNonce = hello.fixed(32)
        let offered = hello.variable()
        var answer = Reader(bytes: serverHello[...])
        #expect(answer.u8() == 2 && answer.u8() == version)
        let suite = answer.u8()
        let gatewayCertificate = answer.variable()
        let gatewayEphemeral = answer.fixed(32)
        let gatewayNonce = answer.fixed(32)
        let signature = answer.fixed(64)

        let gatewayKey = try Curve25519.Signing.PublicKey(
            rawRepresentation: try IdentityCertificate(der: gatewayCertificate).publicKey
        )
        func signedTranscript(deviceID: String, gatewayID: String) -> Bool {
            let parts: [[UInt8]] = [
                Array("ils-e2e-v\(version)".utf8), service, Array(deviceID.utf8), Array(gatewayID.utf8),
                deviceCertificate,
                gatewayCertificate, deviceEphemeral, gatewayEphemeral, deviceNonce, gatewayNonce, offered, [suite],
            ]
            return gatewayKey.isValidSignature(
                signature,
                for: Array("responder\n".utf8) + Self.transcript(parts, version: version)
            )
        }
        // TestIdentities issues `urn:ils:identity:id-<name>`: the transcript holds what follows the prefix.
        #expect(signedTranscript(deviceID: "id-ipad", gatewayID: "id-gw"))
        #expect(!signedTranscript(deviceID: "urn:ils:identity:id-ipad", gatewayID: "urn:ils:identity:id-gw"))
    }

    @Test(
        "AES-GCM records follow the documented iv and key changes: one iv from the first key, n never restarts",
        arguments: [E2ESuite.aes256gcm, .aes256gcmHKDF]
    )
    func ivAcrossKeyChanges(suite: E2ESuite) throws {
        let first = [UInt8](repeating: 0x11, count: 32)
        // Every 2 records instead of 2²⁰, as in the known answers.
        let sender = E2ERecordSuites.sender(suite, key: first, recordsPerKey: 2)
        let hkdf = suite == .aes256gcmHKDF
        let iv =
            hkdf
            ? Self.hkdf(first, "ils-e2e-v3 iv", 12)
            : Array(Self.blake2b(Array("ils-e2e-v2 iv".utf8), key: first, length: 16).prefix(12))
        var key = first
        for n in 0..<7 {
            if n > 0, n % 2 == 0 {
                key =
                    hkdf
                    ? Self.hkdf(key, "ils-e2e-v3 rekey", 32)
                    : Self.blake2b(Array("ils-e2e-v2 rekey".utf8), key: key, length: 32)
            }
            var nonce = iv
            withUnsafeBytes(of: UInt64(n).bigEndian) { counter in
                for index in 0..<8 { nonce[4 + index] ^= counter[index] }
            }
            let plaintext = Array("record \(n)".utf8)
            let final = n == 6
            let flags: UInt8 = final ? 0x01 : 0x00
            let box = try AES.GCM.seal(
                plaintext,
                using: SymmetricKey(data: key),
                nonce: try AES.GCM.Nonce(data: nonce),
                authenticating: [flags]
            )
            let expected = [flags] + Array(box.ciphertext) + Array(box.tag)
            #expect(sender.seal(plaintext, final: final) == expected, "record \(n)")
        }
    }
}
