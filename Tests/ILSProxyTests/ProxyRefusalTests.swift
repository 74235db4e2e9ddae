import ILSTesting
import NIOCore
import Testing

@Suite("Requests HTTP mode refuses")
struct ProxyRefusalTests {
    /// Each raw request, the status the gateway must answer, and the error code in its JSON body.
    static let cases: [(name: String, request: String, status: Int, code: String)] = [
        (
            "both Content-Length and Transfer-Encoding",
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            400, ""
        ),
        (
            "conflicting Content-Length values",
            "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            400, ""
        ),
        ("not HTTP at all", "HELLO THERE\r\n\r\n", 400, "malformed_request"),
        ("missing Host", "GET /health HTTP/1.1\r\n\r\n", 400, "malformed_request"),
        ("a target that is not a path", "GET health HTTP/1.1\r\nHost: x\r\n\r\n", 400, "malformed_request"),
        ("an asterisk target outside OPTIONS", "GET * HTTP/1.1\r\nHost: x\r\n\r\n", 400, "invalid_target"),
        ("CONNECT", "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405, "method_not_allowed"),
        (
            "a final transfer coding that is not chunked",
            "POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
            400, ""
        ),
    ]

    @Test(
        "malformed and smuggling requests get a JSON error, and the backend never sees them",
        arguments: 0..<cases.count
    )
    func refusal(index: Int) async throws {
        let testCase = Self.cases[index]
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.send(testCase.request)
            let head = try await connection.readHead()
            #expect(head.status == testCase.status, "\(testCase.name)")
            let body = String(buffer: try await connection.readBody())
            // RFC 9110 §9.3.6: no response to CONNECT has content, so that refusal is the status alone.
            if !testCase.request.hasPrefix("CONNECT") {
                #expect(head.header("content-type") == "application/json")
                #expect(body.hasPrefix("{\"error\":\""), "\(testCase.name)")
            }
            if !testCase.code.isEmpty, !testCase.request.hasPrefix("CONNECT") {
                #expect(body.contains("\"code\":\"\(testCase.code)\""), "\(testCase.name)")
            }
            #expect(await connection.isClosedByPeer())
            #expect(fixture.backend.record.connectionsAccepted == 0, "\(testCase.name) reached the backend")
        }
    }

    @Test("an oversized header section gets 431")
    func oversizedHeaders() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            let big = String(repeating: "a", count: 70 * 1024)
            try await connection.send("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: \(big)\r\n\r\n")
            let head = try await connection.readHead()
            #expect(head.status == 431)
            #expect(String(buffer: try await connection.readBody()).contains("headers_too_large"))
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("too many header fields get 431")
    func tooManyHeaders() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            let fields = (0..<200).map { "X-F\($0): v\r\n" }.joined()
            try await connection.send("GET /health HTTP/1.1\r\nHost: x\r\n\(fields)\r\n")
            #expect(try await connection.readHead().status == 431)
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("forwarding headers are set by the gateway; client copies and hop-by-hop headers never reach the backend")
    func forwardingHeaders() async throws {
        try await ProxyFixture.with(tls: true) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest(
                "GET",
                "/headers",
                headers: [
                    ("X-ILS-Identity", "mallory"), ("X-ILS-Identity-Id", "id-forged"),
                    ("X-Forwarded-For", "6.6.6.6"), ("Forwarded", "for=6.6.6.6"),
                    ("Keep-Alive", "timeout=5"), ("Proxy-Connection", "keep-alive"),
                    ("Connection", "keep-alive, X-Secret, Host"), ("X-Secret", "hop"), ("X-Kept", "yes"),
                ]
            )
            #expect(try await connection.readHead().status == 200)
            let lines = String(buffer: try await connection.readBody()).split(separator: "\n").map(String.init)
            #expect(lines.contains("host: 127.0.0.1"))
            #expect(lines.contains("x-kept: yes"))
            #expect(lines.contains("x-forwarded-for: 127.0.0.1"))
            #expect(lines.contains("x-forwarded-proto: https"))
            #expect(lines.contains("forwarded: for=127.0.0.1;host=\"127.0.0.1\";proto=https"))
            for forbidden in [
                "x-ils-identity:", "x-ils-identity-id:", "keep-alive:", "proxy-connection:", "x-secret:",
                "6.6.6.6",
            ] {
                #expect(!lines.contains { $0.contains(forbidden) }, "\(forbidden) reached the backend")
            }
            await connection.close()
        }
    }
}
