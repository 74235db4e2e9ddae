import CSodium
import Crypto
import Foundation
import ILSCore
import ILSCrypto
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

    /// `T = BLAKE2b-256(for each part p: u32(len p) ‖ p)`.
    static func transcript(_ parts: [[UInt8]]) -> [UInt8] {
        var input: [UInt8] = []
        for part in parts {
            withUnsafeBytes(of: UInt32(part.count).bigEndian) { input += $0 }
            input += part
        }
        return blake2b(input, length: 32)
    }

    @Test("the gateway signs the transcript built from the documented parts, with the bare identity ids")
    func transcriptUsesBareIDs() throws {
        let parties = try E2EParties()
        let initiator = E2EInitiator(credentials: parties.device, service: "claude-api")
        let clientHello = initiator.clientHello()
        let (serverHello, _, _) = try E2EResponder(credentials: parties.gateway).receiveClientHello(clientHello)

        var hello = Reader(bytes: clientHello[...])
        #expect(hello.u8() == 1 && hello.u8() == 2)
        let service = hello.variable()
        let deviceCertificate = hello.variable()
        let deviceEphemeral = hello.fixed(32)
        let deviceNonce = hello.fixed(32)
        let offered = hello.variable()
        var answer = Reader(bytes: serverHello[...])
        #expect(answer.u8() == 2 && answer.u8() == 2)
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
                Array("ils-e2e-v2".utf8), service, Array(deviceID.utf8), Array(gatewayID.utf8), deviceCertificate,
                gatewayCertificate, deviceEphemeral, gatewayEphemeral, deviceNonce, gatewayNonce, offered, [suite],
            ]
            return gatewayKey.isValidSignature(signature, for: Array("responder\n".utf8) + Self.transcript(parts))
        }
        // TestIdentities issues `urn:ils:identity:id-<name>`: the transcript holds what follows the prefix.
        #expect(signedTranscript(deviceID: "id-ipad", gatewayID: "id-gw"))
        #expect(!signedTranscript(deviceID: "urn:ils:identity:id-ipad", gatewayID: "urn:ils:identity:id-gw"))
    }

    @Test("AES-GCM records follow the documented iv and key changes: one iv from the first key, n never restarts")
    func ivAcrossKeyChanges() throws {
        let first = [UInt8](repeating: 0x11, count: 32)
        // Every 2 records instead of 2²⁰, as in the known answers.
        let sender = E2ERecordSender(suite: .aes256gcm, key: first, recordsPerKey: 2)
        let iv = Array(Self.blake2b(Array("ils-e2e-v2 iv".utf8), key: first, length: 16).prefix(12))
        var key = first
        for n in 0..<7 {
            if n > 0, n % 2 == 0 {
                key = Self.blake2b(Array("ils-e2e-v2 rekey".utf8), key: key, length: 32)
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
