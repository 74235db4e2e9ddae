import Crypto
import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSCrypto
import Testing
import X509

/// The enrollment check a client may make when its TLS stack lets it set a trust anchor but not see the chain the
/// server presents (docs/protocol.md, "Enrolling, step by step"): take the CA from `/v1/enroll/info`, accept it only
/// if its DER hashes to the token's `ils_ca`, then trust that CA alone, with the host name checked, for the
/// enrollment itself.
@Suite("Enrollment through a pinned trust anchor")
struct EnrollmentAnchorTests {
    @Test("the CA pinned to the token's fingerprint verifies the controller, and enrollment goes through on it")
    func anchorPinnedToTheToken() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let claims = try EnrollmentToken.parse(token).claims
            let address = try ControllerAddress(parsing: claims.iss)
            // First contact. Nothing learned here is trusted until the CA is pinned (a client without access to
            // the chain makes this request without checking it; the token is not sent on it).
            let first: ControllerAPI.EnrollInfo = try await ControllerClient(
                address: address,
                trust: .pinnedFingerprint(claims.ils_ca)
            ).call(.GET, "/v1/enroll/info")
            let ca = try Certificate(pemEncoded: first.caCertificate)
            #expect(Fingerprint.sha256(try ca.serializeAsPEM().derBytes) == claims.ils_ca)

            let anchored = ControllerClient(address: address, trust: .certificateAuthority(first.caCertificate))
            let info: ControllerAPI.EnrollInfo = try await anchored.call(.GET, "/v1/enroll/info")
            #expect(info.address == claims.iss)
            let keyPair = IdentityKeyPair.generate()
            let response: ControllerAPI.EnrollResponse = try await anchored.call(
                .POST,
                "/v1/enroll",
                body: EnrollmentProof.makeRequest(token: token, keyPair: keyPair)
            )
            let certificate = try IdentityCertificate(pem: response.certificate)
            #expect(certificate.publicKey == keyPair.publicKey && certificate.name == "ipad")
        }
    }

    @Test("anchored to any other CA, the connection fails before a request is sent")
    func otherAnchorRefused() async throws {
        try await ControllerFixture.with { fixture in
            let claims = try EnrollmentToken.parse(try await fixture.token(for: "ipad")).claims
            let other = try CertificateAuthority.create(name: "someone else's CA")
            let client = ControllerClient(
                address: try ControllerAddress(parsing: claims.iss),
                trust: .certificateAuthority(other.certificatePEM)
            )
            await #expect(throws: ILSError.self) {
                let _: ControllerAPI.EnrollInfo = try await client.call(.GET, "/v1/enroll/info")
            }
            #expect(try await fixture.state.store.identity(named: "ipad")?.state == .pending)
        }
    }
}
