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

    /// Timers are lazy (a request moves the deadline, the timer looks at it when it fires): the idle timeout counts
    /// from the end of the last response, not from when the connection first went idle.
    ///
    /// A 10 s timeout and 6 s pauses: the second request comes past the timeout counted from accept, and within it
    /// counted from the first response. Whether a run shows that depends on the sleeps keeping time, which a loaded
    /// machine does not promise (a 6 s sleep overran by 4 s in CI of session 24), so each attempt measures its own
    /// gaps and counts only if they came out as planned; one that did not is tried again, up to three times.
    @Test("the idle timeout starts again after every response")
    func idleTimeoutRestartsAfterEachResponse() async throws {
        let timeout = TestTiming.scaled(Duration.seconds(10))
        let pause = TestTiming.scaled(Duration.seconds(6))
        let slack = TestTiming.scaled(Duration.seconds(1))
        let clock = ContinuousClock()
        var conclusive = false
        for _ in 0..<3 where !conclusive {
            try await ProxyFixture.with(configure: {
                $0.proxy.clientIdleTimeout = TestTiming.scaled(TimeSpan.seconds(10))
            }) { fixture in
                let connection = try await fixture.connect()
                let accepted = clock.now
                // Sleep: an idle pause on the connection is what the idle timeout counts; no event stands for it.
                try await Task.sleep(for: pause)
                guard clock.now - accepted < timeout - slack else {
                    await connection.close()
                    return
                }
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
                let answered = clock.now
                // Sleep: the second idle pause, past the timeout counted from accept; the pause is the test.
                try await Task.sleep(for: pause)
                let sent = clock.now
                // Past the timeout from accept, within it from the answer: else this attempt shows nothing.
                guard sent - accepted > timeout + slack, sent - answered < timeout - slack else {
                    await connection.close()
                    return
                }
                conclusive = true
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
                await connection.close()
            }
        }
        #expect(conclusive, "the machine stalled in every attempt; nothing was shown either way")
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
