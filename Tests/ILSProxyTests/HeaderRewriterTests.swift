import ILSCore
import NIOCore
import NIOHTTP1
import Testing

@testable import ILSProxy

@Suite("Header rules of the reverse proxy")
struct HeaderRewriterTests {
    let client = ClientContext(
        remoteAddress: try! SocketAddress(ipAddress: "192.0.2.7", port: 50000),
        scheme: .https,
        identity: PeerIdentity(id: "id-123", name: "ipad")
    )

    func request(_ headers: [(String, String)], method: HTTPMethod = .GET, uri: String = "/x") -> HTTPRequestHead {
        HTTPRequestHead(version: .http1_1, method: method, uri: uri, headers: HTTPHeaders(headers))
    }

    func forwarded(_ head: HTTPRequestHead) throws -> ForwardedRequest {
        try HeaderRewriter.forwardRequest(head, client: client).get()
    }

    @Test("the verified identity is added and any client copy is replaced")
    func identityHeaders() throws {
        let out = try forwarded(request([("Host", "h"), ("x-ils-identity", "mallory"), ("X-ILS-Identity-Id", "x")]))
        #expect(out.head.headers["X-ILS-Identity"] == ["ipad"])
        #expect(out.head.headers["X-ILS-Identity-Id"] == ["id-123"])
    }

    @Test("without a verified identity no identity header reaches the backend")
    func noIdentityNoHeader() throws {
        let anonymous = ClientContext(remoteAddress: nil, scheme: .http)
        let out = try HeaderRewriter.forwardRequest(
            request([("Host", "h"), ("X-ILS-Identity", "mallory")]),
            client: anonymous
        ).get()
        #expect(out.head.headers["X-ILS-Identity"].isEmpty)
        #expect(out.head.headers["X-Forwarded-For"] == ["unknown"])
    }

    @Test("hop-by-hop headers and those named by Connection are removed; Host and Content-Length never are")
    func hopByHop() throws {
        let out = try forwarded(
            request(
                [
                    ("Host", "h"), ("Connection", "close, X-Private, Host, Content-Length"), ("X-Private", "1"),
                    ("Keep-Alive", "5"), ("TE", "trailers"), ("Proxy-Authorization", "secret"), ("Upgrade", "h2c"),
                    ("Content-Length", "3"), ("X-Public", "2"),
                ],
                method: .POST
            )
        )
        let names = Set(out.head.headers.map { $0.name.lowercased() })
        #expect(
            names.isDisjoint(with: ["connection", "x-private", "keep-alive", "te", "proxy-authorization", "upgrade"])
        )
        #expect(out.head.headers["Host"] == ["h"])
        #expect(out.head.headers["Content-Length"] == ["3"])
        #expect(out.head.headers["X-Public"] == ["2"])
        #expect(out.clientWantsClose)
        #expect(!out.isUpgrade)
        #expect(out.hasBody)
    }

    @Test("X-Forwarded-* and Forwarded are the gateway's, not the client's")
    func forwardingHeaders() throws {
        let out = try forwarded(
            request([
                ("Host", "api.example"), ("X-Forwarded-For", "6.6.6.6"),
                ("Forwarded", "for=6.6.6.6"), ("X-Real-IP", "6.6.6.6"),
            ])
        )
        #expect(out.head.headers["X-Forwarded-For"] == ["192.0.2.7"])
        #expect(out.head.headers["X-Forwarded-Proto"] == ["https"])
        #expect(out.head.headers["X-Forwarded-Host"] == ["api.example"])
        #expect(out.head.headers["Forwarded"] == ["for=192.0.2.7;host=\"api.example\";proto=https"])
        #expect(out.head.headers["X-Real-IP"].isEmpty)
    }

    @Test("an IPv6 client is bracketed and quoted in Forwarded (RFC 7239 §6)")
    func forwardedIPv6() {
        #expect(HeaderRewriter.forwardedElement(for: "::1", host: "", proto: "http") == "for=\"[::1]\";proto=http")
    }

    @Test("a WebSocket handshake keeps Upgrade and Connection: upgrade")
    func upgradeKept() throws {
        let out = try forwarded(request([("Host", "h"), ("Connection", "Upgrade"), ("Upgrade", "websocket")]))
        #expect(out.isUpgrade)
        #expect(out.head.headers["Upgrade"] == ["websocket"])
        #expect(out.head.headers["Connection"] == ["upgrade"])
    }

    @Test(
        "ambiguous framing is refused",
        arguments: [
            [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
            [("Content-Length", "5"), ("Content-Length", "6")],
            [("Content-Length", "5, 6")],
            [("Transfer-Encoding", "chunked, gzip")],
            [("Transfer-Encoding", "gzip")],
        ]
    )
    func ambiguousFraming(headers: [(String, String)]) {
        let result = HeaderRewriter.forwardRequest(request([("Host", "h")] + headers, method: .POST), client: client)
        #expect(throws: ProxyError.self) { try result.get() }
    }

    @Test("identical repeated Content-Length values are one length (RFC 9112 §6.3)")
    func repeatedSameLength() throws {
        let out = try forwarded(
            request(
                [("Host", "h"), ("Content-Length", "5"), ("Content-Length", "5")],
                method: .POST
            )
        )
        #expect(out.hasBody)
    }

    @Test("a chunked request stays chunked; a bodiless POST says Content-Length: 0")
    func framingForwarded() throws {
        let chunked = try forwarded(request([("Host", "h"), ("Transfer-Encoding", "chunked")], method: .POST))
        #expect(chunked.head.headers["Transfer-Encoding"] == ["chunked"])
        #expect(chunked.hasBody)
        let empty = try forwarded(request([("Host", "h")], method: .POST))
        #expect(empty.head.headers["Content-Length"] == ["0"])
        #expect(!empty.hasBody)
    }

    @Test("absolute-form targets become origin-form with the authority as Host (RFC 9112 §3.2.2)")
    func absoluteForm() throws {
        let out = try forwarded(request([("Host", "ignored")], uri: "http://api.example:8443/claude/stream?x=1"))
        #expect(out.head.uri == "/claude/stream?x=1")
        #expect(out.head.headers["Host"] == ["api.example:8443"])
    }

    @Test("CONNECT, a missing or doubled Host, and odd targets are refused")
    func refusals() {
        let cases: [HTTPRequestHead] = [
            request([("Host", "h")], method: .CONNECT, uri: "h:443"),
            request([]),
            request([("Host", "a"), ("Host", "b")]),
            request([("Host", "h")], uri: "*"),
            request([("Host", "h")], uri: "ftp://x/y"),
        ]
        for head in cases {
            #expect(throws: ProxyError.self) { try HeaderRewriter.forwardRequest(head, client: client).get() }
        }
    }

    @Test("the response loses hop-by-hop headers, and says close when the gateway will close")
    func responseHeaders() {
        let head = HTTPResponseHead(
            version: .http1_1,
            status: .ok,
            headers: HTTPHeaders([
                ("Connection", "X-Hop"), ("X-Hop", "1"), ("Keep-Alive", "5"),
                ("Transfer-Encoding", "chunked"), ("Content-Type", "text/event-stream"),
            ])
        )
        let out = HeaderRewriter.clientResponse(head, requestVersion: .http1_1, closeAfter: true)
        #expect(out.headers["X-Hop"].isEmpty)
        #expect(out.headers["Keep-Alive"].isEmpty)
        #expect(out.headers["Transfer-Encoding"].isEmpty)
        #expect(out.headers["Content-Type"] == ["text/event-stream"])
        #expect(out.headers["Connection"] == ["close"])
    }

    @Test("error bodies are valid JSON with the stable code")
    func errorBody() {
        let error = ProxyError(status: .badGateway, code: "x_y", reason: "A \"quoted\"\nline.")
        let body = String(buffer: error.jsonBody(allocator: ByteBufferAllocator()))
        #expect(body == "{\"error\":\"A \\\"quoted\\\"\\nline.\",\"code\":\"x_y\"}\n")
    }

    @Test("only a WebSocket handshake on GET switches protocols; h2c and other upgrades are plain requests")
    func onlyWebSocketUpgrades() throws {
        let h2c = try forwarded(
            request([
                ("Host", "h"), ("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c"),
                ("HTTP2-Settings", "AAMAAABkAAQAAP__"),
            ])
        )
        #expect(!h2c.isUpgrade)
        #expect(h2c.head.headers["Upgrade"].isEmpty)
        #expect(h2c.head.headers["HTTP2-Settings"].isEmpty)
        let post = try forwarded(
            request([("Host", "h"), ("Connection", "Upgrade"), ("Upgrade", "websocket")], method: .POST)
        )
        #expect(!post.isUpgrade)
    }

    @Test("underscore spellings of gateway-owned headers are dropped too (CGI maps them to the same name)")
    func underscoreVariants() throws {
        let out = try forwarded(request([("Host", "h"), ("X_ILS_Identity", "admin"), ("X_Forwarded_For", "6.6.6.6")]))
        #expect(!out.head.headers.contains { $0.name.contains("_") })
        #expect(out.head.headers["X-ILS-Identity"] == ["ipad"])
    }

    @Test("request trailers cannot carry gateway-owned or hop-by-hop headers")
    func trailersFiltered() {
        let trailers = HTTPHeaders([("X-ILS-Identity", "admin"), ("Connection", "close"), ("X-Checksum", "abc")])
        let out = HeaderRewriter.forwardTrailers(trailers)
        #expect(out?["X-ILS-Identity"].isEmpty == true)
        #expect(out?["Connection"].isEmpty == true)
        #expect(out?["X-Checksum"] == ["abc"])
    }

    @Test("a transfer coding other than exactly chunked is refused")
    func onlyChunked() {
        let result = HeaderRewriter.forwardRequest(
            request([("Host", "h"), ("Transfer-Encoding", "gzip, chunked")], method: .POST),
            client: client
        )
        #expect(throws: ProxyError.self) { try result.get() }
    }
}
