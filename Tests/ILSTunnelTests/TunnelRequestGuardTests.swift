import ILSCore
import NIOCore
import Testing

@testable import ILSTunnel

/// The tunnel's request framing (every byte forwarded unchanged, each head seen whole) and its site policy (the
/// device's programs pass; a rebinding name, another origin and a cross-site browser request do not).
@Suite("TunnelRequestGuard: requests framed and checked before a circuit")
struct TunnelRequestGuardTests {
    /// Feeds `text` in pieces of `size` bytes; returns the heads seen and the bytes forwarded, in order.
    static func frame(_ text: String, pieces size: Int) throws -> (heads: [TunnelRequestHead], bytes: String) {
        var framing = RequestFraming()
        var heads: [TunnelRequestHead] = []
        var out = ""
        let bytes = Array(text.utf8)
        for start in stride(from: 0, to: bytes.count, by: size) {
            let piece = ByteBuffer(bytes: bytes[start..<min(start + size, bytes.count)])
            for step in try framing.feed(piece) {
                switch step {
                case .head(let head, let raw):
                    heads.append(head)
                    out += String(buffer: raw)
                case .forward(let raw):
                    out += String(buffer: raw)
                }
            }
        }
        return (heads, out)
    }

    static let pipelined =
        "GET /a HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n"
        + "POST /b HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\nhello"
        + "POST /c HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
        + "3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n"
        + "\r\nGET /d HTTP/1.1\r\nHost: localhost\r\n\r\n"

    @Test(
        "every head of a pipelined stream is found, whatever the read sizes, and every byte goes on unchanged",
        arguments: [1, 2, 3, 7, 64, 4096]
    )
    func pipelinedHeads(pieces: Int) throws {
        let (heads, bytes) = try Self.frame(Self.pipelined, pieces: pieces)
        #expect(heads.map(\.target) == ["/a", "/b", "/c", "/d"])
        #expect(bytes == Self.pipelined)
        #expect(heads[0].values("host") == ["127.0.0.1:8080"])
    }

    @Test("a body that looks like a request is not taken for one")
    func bodyIsNotAHead() throws {
        let body = "GET /hidden HTTP/1.1\r\nHost: evil.example\r\n\r\n"
        let text = "POST /a HTTP/1.1\r\nHost: localhost\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
        let (heads, bytes) = try Self.frame(text, pieces: 5)
        #expect(heads.map(\.target) == ["/a"])
        #expect(bytes == text)
    }

    @Test("after an upgrade the rest of the connection is not HTTP")
    func upgradePassesThrough() throws {
        let text =
            "GET /ws HTTP/1.1\r\nHost: localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
            + "GET /not-a-request HTTP/1.1\r\n\r\n\u{1}\u{2}"
        let (heads, bytes) = try Self.frame(text, pieces: 9)
        #expect(heads.map(\.target) == ["/ws"])
        #expect(bytes == text)
    }

    @Test(
        "what two parsers might read differently is refused",
        arguments: [
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: +3\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n",
            "GET / HTTP/1.1\nHost: a\r\n\r\n",
            "GET / HTTP/1.1\r\nHost : a\r\n\r\n",
            "GET /  HTTP/1.1\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n",
        ]
    )
    func ambiguousIsRefused(text: String) {
        #expect(throws: RequestFraming.Malformed.self) { try Self.frame(text, pieces: 4) }
    }

    @Test("a head larger than the gateway's limit is 431")
    func oversizedHead() {
        let text = "GET / HTTP/1.1\r\nX: " + String(repeating: "a", count: RequestFraming.maximumHeadBytes) + "\r\n\r\n"
        #expect(
            throws: RequestFraming.Malformed(
                status: 431,
                code: "headers_too_large",
                reason: "the request head is too large"
            )
        ) {
            try Self.frame(text, pieces: 1000)
        }
    }

    // MARK: the site policy

    static let policy = TunnelSitePolicy(
        listenHost: "127.0.0.1",
        service: "claude-api",
        allowedHosts: ["tablet.lan"],
        allowedOrigins: ["http://localhost:3000"]
    )

    static func head(_ fields: [(String, String)], method: String = "GET", target: String = "/") -> TunnelRequestHead {
        TunnelRequestHead(method: method, target: target, version: "HTTP/1.1", fields: fields.map { ($0.0, $0.1) })
    }

    static func code(_ verdict: TunnelSitePolicy.Verdict) -> String? {
        if case .refused(let refusal, _) = verdict { return refusal.code }
        return nil
    }

    @Test(
        "curl, the app and the tunnel's own pages pass",
        arguments: [
            [("host", "127.0.0.1:8080")],
            [("host", "localhost:8080"), ("user-agent", "curl/8")],
            [("host", "[::1]:8080")],
            [("host", "claude-api")],
            [("host", "tablet.lan:8080")],
            [("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "same-origin")],
            [("host", "127.0.0.1:8080"), ("sec-fetch-site", "none")],
            [("host", "127.0.0.1:8080"), ("origin", "http://localhost:3000"), ("sec-fetch-site", "same-site")],
            [],
        ]
    )
    func programsPass(fields: [(String, String)]) {
        #expect(Self.policy.check(Self.head(fields), localPort: 8080) == .allowed)
    }

    @Test("a rebinding name is 421, in Host or in an absolute target")
    func rebindingIs421() {
        #expect(
            Self.code(Self.policy.check(Self.head([("host", "evil.example:8080")]), localPort: 8080))
                == "misdirected_request"
        )
        #expect(
            Self.code(Self.policy.check(Self.head([("host", "127.0.0.1.evil.example")]), localPort: 8080))
                == "misdirected_request"
        )
        let absolute = Self.head([("host", "127.0.0.1")], target: "http://evil.example:8080/claude")
        #expect(Self.code(Self.policy.check(absolute, localPort: 8080)) == "misdirected_request")
        #expect(
            Self.code(Self.policy.check(Self.head([("host", "a"), ("host", "b")]), localPort: 8080))
                == "malformed_request"
        )
    }

    @Test(
        "a browser's request from another site is 403",
        arguments: [
            [("host", "127.0.0.1:8080"), ("origin", "https://evil.example")],
            [("host", "127.0.0.1:8080"), ("origin", "null")],
            [("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:9999")],
            [("host", "127.0.0.1:8080"), ("origin", "http://localhost:3000.evil.example")],
            [("host", "127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
            [("host", "127.0.0.1:8080"), ("sec-fetch-site", "same-site")],
            [("host", "127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080"), ("sec-fetch-site", "cross-site")],
        ]
    )
    func crossSiteIs403(fields: [(String, String)]) {
        #expect(Self.code(Self.policy.check(Self.head(fields), localPort: 8080)) == "cross_site_request")
    }

    @Test("CONNECT is 405")
    func connectIs405() {
        let head = Self.head([("host", "127.0.0.1:8080")], method: "CONNECT", target: "example.com:443")
        #expect(Self.code(Self.policy.check(head, localPort: 8080)) == "method_not_allowed")
    }

    @Test("origins normalise; an --allow-origin that could never match is refused at start")
    func originsNormalise() throws {
        #expect(TunnelSitePolicy.normalized(origin: "HTTP://LocalHost:80") == "http://localhost")
        #expect(TunnelSitePolicy.normalized(origin: "https://a.example:443") == "https://a.example")
        #expect(TunnelSitePolicy.normalized(origin: "http://[::1]:3000") == "http://[::1]:3000")
        #expect(TunnelSitePolicy.normalized(origin: "null") == nil)
        #expect(TunnelSitePolicy.normalized(origin: "http://a.example/path") == nil)
        #expect(TunnelSitePolicy.normalized(origin: "http://a.example:99999") == nil)
        #expect(throws: ILSError.self) {
            try TunnelSitePolicy.validate(allowedHosts: [], allowedOrigins: ["localhost:3000"])
        }
        #expect(throws: ILSError.self) { try TunnelSitePolicy.validate(allowedHosts: ["a b"], allowedOrigins: []) }
        try TunnelSitePolicy.validate(allowedHosts: ["tablet.lan"], allowedOrigins: ["http://localhost:3000"])
    }

    @Test("a page's flood of refusals writes one line per origin and reason a minute, then its count")
    func refusalsAreAggregated() {
        var aggregator = RefusalAggregator(window: 60, maximumSources: 64)
        var rows: [RefusalAggregator.Row] = []
        for second in 0..<1000 {
            rows += aggregator.record(
                source: "https://evil.example",
                code: "cross_site_request",
                now: Int64(second / 100)
            )
        }
        rows += aggregator.drain()
        #expect(
            rows == [
                RefusalAggregator.Row(actor: "https://evil.example", detail: "cross_site_request"),
                RefusalAggregator.Row(actor: "https://evil.example", detail: "cross_site_request count=999"),
            ]
        )
    }
}
