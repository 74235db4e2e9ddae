import ILSCore
import ILSCrypto
import Testing

@Suite("Enrollment token format")
struct TokenTests {
    let key = IdentityKeyPair.generate()
    let claims = EnrollmentToken.Claims(
        iss: "https://127.0.0.1:7443",
        sub: "id",
        jti: "j",
        iat: 100,
        exp: 200,
        caFingerprint: String(repeating: "a", count: 64),
        name: "ipad",
        role: .device
    )

    @Test("a signed token verifies and round-trips its claims")
    func roundTrip() throws {
        let token = EnrollmentToken.sign(claims, seed: key.seedForSigning)
        #expect(try EnrollmentToken.verify(token, publicKey: key.publicKey, now: 150) == claims)
    }

    @Test("expiry is exclusive: a token is dead at exp")
    func expiry() {
        let token = EnrollmentToken.sign(claims, seed: key.seedForSigning)
        #expect(throws: EnrollmentRefusal.expired.error) {
            try EnrollmentToken.verify(token, publicKey: key.publicKey, now: 200)
        }
    }

    @Test("another key's signature is refused")
    func wrongKey() {
        let token = EnrollmentToken.sign(claims, seed: IdentityKeyPair.generate().seedForSigning)
        #expect(throws: EnrollmentRefusal.badSignature.error) {
            try EnrollmentToken.verify(token, publicKey: key.publicKey, now: 150)
        }
    }

    @Test("only EdDSA is accepted", arguments: ["none", "HS256", "RS256", "ES256", "eddsa"])
    func algorithms(alg: String) {
        let token = EnrollmentToken.sign(claims, seed: key.seedForSigning)
        let parts = token.split(separator: ".")
        let header = Base64URL.encode(Array("{\"alg\":\"\(alg)\",\"typ\":\"JWT\"}".utf8))
        #expect(throws: EnrollmentRefusal.unsupportedAlgorithm.error) {
            try EnrollmentToken.verify("\(header).\(parts[1]).\(parts[2])", publicKey: key.publicKey, now: 150)
        }
    }

    @Test(
        "oversized and malformed tokens are refused cheaply",
        arguments: [
            String(repeating: "a", count: 5000), "a.b", "a.b.c.d", "!!.!!.!!", "",
        ]
    )
    func malformed(token: String) {
        #expect(throws: ILSError.self) { try EnrollmentToken.parse(token) }
    }

    @Test("base64url decoding is strict")
    func base64url() {
        #expect(Base64URL.decode("aGk") == Array("hi".utf8))
        #expect(Base64URL.decode("aGk=") == nil)
        #expect(Base64URL.decode("a+k") == nil)
        #expect(Base64URL.decode("a") == nil)
    }

    @Test("identity keys made with libsodium sign what Ed25519 verifiers accept, and survive PKCS#8")
    func keys() throws {
        let message = Array("hello".utf8)
        let restored = try IdentityKeyPair(privateKeyPEM: key.privateKeyPEM)
        #expect(restored.publicKey == key.publicKey)
        #expect(Ed25519.verify(restored.sign(message), of: message, publicKey: key.publicKey))
        #expect(!Ed25519.verify(restored.sign(message), of: Array("hellO".utf8), publicKey: key.publicKey))
    }
}
