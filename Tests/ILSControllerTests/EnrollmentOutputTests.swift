import Foundation
import ILSClient
import ILSCore
import ILSTesting
import Testing

@Suite("Enrollment outputs: reserved before the token is spent, undone on refusal")
struct EnrollmentOutputTests {
    @Test("a refused enrollment into new directories leaves neither files nor the directories it made")
    func refusalLeavesNoDirectories() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            _ = try await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("a.json"),
                force: false,
                answerTimeout: ControllerClient.patientTimeout
            )
            let nested = fixture.path("new/deeper/ipad.json")
            await #expect(throws: EnrollmentRefusal.used.error) {
                _ = try await Enrollment.enroll(
                    token: token,
                    outputPath: nested,
                    force: false,
                    pem: true,
                    answerTimeout: ControllerClient.patientTimeout
                )
            }
            #expect(!FileManager.default.fileExists(atPath: fixture.path("new")))
        }
    }

    @Test("--pem writes the certificate, key and CA next to the identity file, each 0600, matching it")
    func pemFiles() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "laptop")
            let result = try await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("laptop.json"),
                force: false,
                pem: true
            )
            #expect(result.pemPaths == ["cert", "key", "ca"].map { fixture.path("laptop.\($0).pem") })
            let contents = result.pemPaths.map {
                FileManager.default.contents(atPath: $0).map { String(decoding: $0, as: UTF8.self) }
            }
            #expect(
                contents[0]?.trimmingCharacters(in: .newlines)
                    == result.file.certificate.trimmingCharacters(in: .newlines)
            )
            #expect(
                contents[1]?.trimmingCharacters(in: .newlines)
                    == result.file.privateKey.trimmingCharacters(in: .newlines)
            )
            #expect(
                contents[2]?.trimmingCharacters(in: .newlines)
                    == result.file.caCertificate.trimmingCharacters(in: .newlines)
            )
            for path in result.pemPaths + [result.path] { #expect(fileMode(path) == 0o600) }
            let leftovers = try FileManager.default.contentsOfDirectory(atPath: fixture.path("")).filter {
                $0.hasSuffix(".tmp")
            }
            #expect(leftovers.isEmpty)
        }
    }
}
