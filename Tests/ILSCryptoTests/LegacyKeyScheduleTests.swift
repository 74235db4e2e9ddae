import CSodium
import Crypto
import ILSCrypto
import ILSSodium
import Testing

/// Versions 1 and 2 moved from libsodium's `crypto_kx` to swift-crypto's X25519 plus BLAKE2b when version 3 came:
/// the keys must be byte for byte what devices built before that derive, or those devices lose their circuits.
@Suite("Handshake versions 1 and 2 key schedule")
struct LegacyKeyScheduleTests {
    @Test("the direction keys are crypto_kx's session keys bound to the transcript with keyed BLAKE2b")
    func matchesCryptoKX() throws {
        for _ in 0..<8 {
            let device = Curve25519.KeyAgreement.PrivateKey()
            let gateway = Curve25519.KeyAgreement.PrivateKey()
            let devicePublic = Array(device.publicKey.rawRepresentation)
            let gatewayPublic = Array(gateway.publicKey.rawRepresentation)
            let transcript = SecureRandom.bytes(32)
            let shared = try device.sharedSecretFromKeyAgreement(with: gateway.publicKey)
            let keys = E2EHandshakeLegacy(2).keys(
                sharedSecret: shared,
                initiatorEphemeral: devicePublic,
                responderEphemeral: gatewayPublic,
                transcript: transcript
            )

            var receive = [UInt8](repeating: 0, count: 32)
            var send = [UInt8](repeating: 0, count: 32)
            let deviceSecret = Array(device.rawRepresentation)
            #expect(crypto_kx_client_session_keys(&receive, &send, devicePublic, deviceSecret, gatewayPublic) == 0)
            #expect(keys.initiatorToResponder == Self.bind(send, transcript))
            #expect(keys.responderToInitiator == Self.bind(receive, transcript))
        }
    }

    static func bind(_ key: [UInt8], _ transcript: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        crypto_generichash(&out, 32, transcript, UInt64(transcript.count), key, key.count)
        return out
    }
}
