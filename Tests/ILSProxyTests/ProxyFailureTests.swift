import ILSCore
import ILSTesting
import NIOCore
import Testing

@Suite("Failures on either side of HTTP mode")
struct ProxyFailureTests {
    @Test("a client that hangs up mid-stream closes the backend request before the stream would have ended")
    func clientDisconnectCancelsBackend() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/sse?n=1000&interval_ms=50")
            #expect(try await connection.readHead().status == 200)
            _ = try await connection.readBodyPart()
            await connection.close()
            #expect(await eventually { fixture.backend.record.streamsDisconnected == 1 })
            #expect(fixture.backend.record.streamsCompleted == 0)
            #expect(fixture.backend.record.eventsSent < 1000)
        }
    }

    @Test("a backend that dies mid-stream ends the client connection instead of leaving it hanging")
    func backendDeathEndsClient() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/die-mid-stream")
            #expect(try await connection.readHead().status == 200)
            await #expect(throws: TestHTTPConnection.Failure.self) {
                while try await connection.readBodyPart() != nil {}
            }
        }
    }

    @Test("with the backend stopped the answer is a 502 JSON error; once it is back, requests succeed again")
    func backendDownThenUp() async throws {
        try await ProxyFixture.with { fixture in
            let port = fixture.backend.port
            await fixture.backend.stop()
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 502)
            #expect(head.header("content-type") == "application/json")
            let body = String(buffer: try await connection.readBody())
            #expect(body.contains("\"code\":\"backend_unreachable\""))
            #expect(body.contains("\"error\":\""))

            let restarted = try await TestBackend.start(port: port)
            let again = try await fixture.connect()
            try await again.sendRequest("GET", "/health")
            #expect(try await again.readHead().status == 200)
            #expect(String(buffer: try await again.readBody()) == "ok")
            await again.close()
            await restarted.stop()
        }
    }

    @Test("a backend that closes before answering gives 502 backend_reset")
    func backendResetBeforeHeaders() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("POST", "/close-before-headers", body: ByteBuffer(string: "x"))
            let head = try await connection.readHead()
            #expect(head.status == 502)
            #expect(String(buffer: try await connection.readBody()).contains("backend_reset"))
        }
    }

    @Test("a backend that never sends headers gives 504 after the header timeout")
    func backendHeaderTimeout() async throws {
        try await ProxyFixture.with(configure: { $0.proxy.backendHeaderTimeout = .milliseconds(300) }) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/slow-headers")
            let head = try await connection.readHead()
            #expect(head.status == 504)
            #expect(String(buffer: try await connection.readBody()).contains("\"code\":\"backend_timeout\""))
        }
    }

    @Test("a stream that keeps moving outlives the header timeout and the idle timeout")
    func movingStreamIsNeverCut() async throws {
        try await ProxyFixture.with(configure: {
            $0.proxy.backendHeaderTimeout = TestTiming.scaled(.seconds(1))
            $0.proxy.clientIdleTimeout = TestTiming.scaled(.seconds(1))
        }) { fixture in
            // Sent on connect: the idle clock starts at accept (see `stalledBodyIsCut`).
            let connection = try await fixture.connect(
                firstBytes:
                    "GET /sse?n=12&interval_ms=\(TestTiming.scaled(milliseconds: 250)) HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            #expect(try await connection.readHead().status == 200)
            let text = String(buffer: try await connection.readBody())
            #expect(text.contains("\"index\": 11"))
            #expect(fixture.backend.record.streamsCompleted == 1)
        }
    }

    @Test("an idle keep-alive client connection is closed after the idle timeout")
    func idleClientIsClosed() async throws {
        // The idle clock starts at accept: the request is sent on connect, or on a loaded machine the server could
        // rightly close the connection before the test's task got to send it.
        try await ProxyFixture.with(configure: { $0.proxy.clientIdleTimeout = .seconds(2) }) { fixture in
            let connection = try await fixture.connect(firstBytes: "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try await connection.readHead().status == 200)
            _ = try await connection.readBody()
            // The server, not the client, ends the connection: the read returns end-of-stream by itself.
            #expect(await connection.isClosedByPeer())
        }
    }
}
