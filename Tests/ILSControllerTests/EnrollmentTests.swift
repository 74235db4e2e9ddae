import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSCrypto
import Testing

@Suite("Enrollment against an in-process controller")
struct EnrollmentTests {
    @Test("a device enrolls: identity file 0600 with a certificate for a key made here")
    func happyPath() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let result = try await Enrollment.enroll(token: token, outputPath: fixture.path("ipad.json"), force: false)
            #expect(fileMode(result.path) == 0o600)
            let file = try IdentityFileIO.read(result.path)
            #expect(file.identity.name == "ipad")
            #expect(file.identity.state == .active)
            let certificate = try IdentityCertificate(pem: file.certificate)
            let key = try IdentityKeyPair(privateKeyPEM: file.privateKey)
            #expect(certificate.publicKey == key.publicKey)
            #expect(certificate.role == .device)
            let stored = try #require(try await fixture.state.store.identity(named: "ipad"))
            #expect(stored.certificateFingerprint == certificate.fingerprint)
        }
    }

    @Test("a used token is refused, and no second file is written")
    func reuseRefused() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            _ = try await Enrollment.enroll(token: token, outputPath: fixture.path("a.json"), force: false)
            let fingerprint = try await fixture.state.store.identity(named: "ipad")?.certificateFingerprint
            await #expect(throws: EnrollmentRefusal.used.error) {
                _ = try await Enrollment.enroll(token: token, outputPath: fixture.path("b.json"), force: false)
            }
            #expect(!FileManager.default.fileExists(atPath: fixture.path("b.json")))
            #expect(try await fixture.state.store.identity(named: "ipad")?.certificateFingerprint == fingerprint)
        }
    }

    @Test(
        "tampered, unsigned and garbage tokens are refused before anything is written",
        arguments: [
            ("payload", EnrollmentRefusal.badSignature), ("signature", .badSignature), ("none", .unsupportedAlgorithm),
            ("garbage", .malformedToken),
        ]
    )
    func tamperedRefused(kind: String, refusal: EnrollmentRefusal) async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let broken = tamper(token, kind)
            await #expect(throws: refusal.error) {
                _ = try await Enrollment.enroll(token: broken, outputPath: fixture.path("x.json"), force: false)
            }
            #expect(!FileManager.default.fileExists(atPath: fixture.path("x.json")))
            #expect(try await fixture.state.store.identity(named: "ipad")?.state == .pending)
        }
    }

    @Test(
        "the controller itself refuses every broken token, whatever a client checked",
        arguments: [
            "payload", "signature", "none", "garbage", "issuer", "ca", "expired", "unknown", "proof",
        ]
    )
    func controllerEnforces(kind: String) async throws {
        try await ControllerFixture.with { fixture in
            let good = try await fixture.token(for: "ipad")
            let claims = try EnrollmentToken.parse(good).claims
            let controller = fixture.controller
            let now = Int64(Date().timeIntervalSince1970)
            let key = IdentityKeyPair.generate()
            var request = EnrollmentProof.makeRequest(token: good, keyPair: key)
            var expected: EnrollmentRefusal
            var at = now
            switch kind {
            case "payload", "signature", "none", "garbage":
                request = EnrollmentProof.makeRequest(token: tamper(good, kind), keyPair: key)
                expected = kind == "none" ? .unsupportedAlgorithm : kind == "garbage" ? .malformedToken : .badSignature
            case "issuer":
                var forged = claims
                forged.iss = "https://evil.example:443"
                request = EnrollmentProof.makeRequest(token: fixture.sign(forged), keyPair: key)
                expected = .wrongIssuer
            case "ca":
                var forged = claims
                forged.ils_ca = String(repeating: "0", count: 64)
                request = EnrollmentProof.makeRequest(token: fixture.sign(forged), keyPair: key)
                expected = .caMismatch
            case "expired":
                at = claims.exp + 1
                expected = .expired
            case "unknown":
                var forged = claims
                forged.jti = "never-issued"
                request = EnrollmentProof.makeRequest(token: fixture.sign(forged), keyPair: key)
                expected = .unknown
            default:
                request.proof = EnrollmentProof.makeRequest(token: good, keyPair: IdentityKeyPair.generate()).proof
                expected = .badProof
            }
            await #expect(throws: expected.error) { _ = try await controller.enroll(request, now: at) }
            let stored = try #require(try await fixture.state.store.identity(named: "ipad"))
            #expect(stored.state == .pending)
            #expect(stored.certificateFingerprint == nil)
        }
    }

    @Test("of many enrollments racing on one token, exactly one wins")
    func raceHasOneWinner() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let results = await withTaskGroup(of: Bool.self) { group in
                for index in 0..<8 {
                    group.addTask {
                        (try? await Enrollment.enroll(
                            token: token,
                            outputPath: fixture.path("r\(index).json"),
                            force: false
                        )) != nil
                    }
                }
                return await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(results.filter { $0 }.count == 1)
            let files = (try? FileManager.default.contentsOfDirectory(atPath: "\(fixture.directory)/out")) ?? []
            #expect(files.filter { $0.hasSuffix(".json") }.count == 1)
        }
    }

    @Test("a token for a controller with another CA fails the pinned TLS handshake")
    func pinMismatch() async throws {
        try await ControllerFixture.with { fixture in
            var claims = try EnrollmentToken.parse(try await fixture.token(for: "ipad")).claims
            claims.ils_ca = String(repeating: "ab", count: 32)
            await #expect(throws: EnrollmentRefusal.caMismatch.error) {
                _ = try await Enrollment.enroll(
                    token: fixture.sign(claims),
                    outputPath: fixture.path("p.json"),
                    force: false
                )
            }
            #expect(!FileManager.default.fileExists(atPath: fixture.path("p.json")))
        }
    }

    @Test("an existing identity file is never replaced without force")
    func noOverwrite() async throws {
        try await ControllerFixture.with { fixture in
            let path = fixture.path("ipad.json")
            try FileManager.default.createDirectory(atPath: fixture.path(""), withIntermediateDirectories: true)
            try "keep me".write(toFile: path, atomically: true, encoding: .utf8)
            let token = try await fixture.token(for: "ipad")
            await #expect(throws: ILSError.self) {
                _ = try await Enrollment.enroll(token: token, outputPath: path, force: false)
            }
            #expect(try String(contentsOfFile: path, encoding: .utf8) == "keep me")
            // The refusal came before the network: the token is still unused.
            #expect(try await fixture.state.store.identity(named: "ipad")?.state == .pending)
            _ = try await Enrollment.enroll(token: token, outputPath: path, force: true)
            #expect(try IdentityFileIO.read(path).identity.name == "ipad")
        }
    }
}

/// Breaks a token in one of the ways an attacker (or a bad copy-paste) would.
func tamper(_ token: String, _ kind: String) -> String {
    let parts = token.split(separator: ".").map(String.init)
    switch kind {
    case "payload":
        var claims = String(decoding: Base64URL.decode(parts[1])!, as: UTF8.self)
        claims = claims.replacingOccurrences(of: "\"ils_role\":\"device\"", with: "\"ils_role\":\"admin\"")
        return "\(parts[0]).\(Base64URL.encode(Array(claims.utf8))).\(parts[2])"
    case "signature":
        var signature = Base64URL.decode(parts[2])!
        signature[0] ^= 0x01
        return "\(parts[0]).\(parts[1]).\(Base64URL.encode(signature))"
    case "none":
        return "\(Base64URL.encode(Array(#"{"alg":"none","typ":"JWT"}"#.utf8))).\(parts[1])."
    default:
        return "not-a-token"
    }
}

extension ControllerFixture {
    /// Signs claims with the controller's real token key: the only way to reach the controller's later checks.
    func sign(_ claims: EnrollmentToken.Claims) -> String {
        let seed = try! IdentityKeyPair(
            privateKeyPEM: String(
                contentsOfFile: "\(directory)/state/token.key",
                encoding: .utf8
            )
        ).seedForSigning
        return EnrollmentToken.sign(claims, seed: seed)
    }
}
