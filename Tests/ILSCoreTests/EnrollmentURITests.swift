import ILSCore
import Testing

@Suite("Enrollment URIs: ils-enroll://v1/<JWT>, as QR codes carry tokens")
struct EnrollmentURITests {
    private static let jwt = "eyJhbGciOiJFZERTQSJ9.eyJqdGkiOiJhYmMifQ.c2lnbmF0dXJlLWJ5dGVz_-"

    @Test("a token goes into a URI and comes back out unchanged, whatever the scheme's case")
    func roundTrip() throws {
        let uri = EnrollmentURI.uri(for: Self.jwt)
        #expect(uri == "ils-enroll://v1/\(Self.jwt)")
        #expect(try EnrollmentURI.token(from: uri) == Self.jwt)
        #expect(try EnrollmentURI.token(from: "ILS-Enroll://v1/\(Self.jwt)") == Self.jwt)
    }

    @Test("text that is not one of our URIs is passed by (nil): a bare token, a path, another scheme")
    func notOurs() throws {
        for text in [Self.jwt, "identities/ipad.jwt", "https://example.com/v1/\(Self.jwt)", "ils-enroll:/v1/x", ""] {
            #expect(try EnrollmentURI.token(from: text) == nil, "\(text)")
        }
    }

    @Test("a URI of ours that is malformed is refused as token_malformed, never guessed at")
    func malformed() {
        let refused = [
            "ils-enroll://v2/\(Self.jwt)",
            "ils-enroll://v1/\(Self.jwt)?next=https://evil",
            "ils-enroll://v1/\(Self.jwt)#x",
            "ils-enroll://v1/a.b",
            "ils-enroll://v1/a..c",
            "ils-enroll://v1/a.b.c/d",
            "ils-enroll://v1",
            "ils-enroll://v1/a.b.c%00",
            "ils-enroll://v1/" + String(repeating: "a.", count: 3000) + "b",
        ]
        for text in refused {
            #expect(throws: ILSError.self, "\(text.prefix(60))") { try EnrollmentURI.token(from: text) }
            do {
                _ = try EnrollmentURI.token(from: text)
            } catch {
                #expect(error.code.name == "token_malformed")
            }
        }
    }
}
