import Crypto
import ILSTesting
import NIOCore
import Testing

@Suite("Streaming through HTTP mode")
struct ProxyStreamingTests {
    @Test("SSE events reach the client one by one, before the backend has finished", arguments: [false, true])
    func sseStreamsEventByEvent(tls: Bool) async throws {
        try await ProxyFixture.with(tls: tls) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/sse?n=20&interval_ms=\(TestTiming.scaled(milliseconds: 100))")
            let head = try await connection.readHead()
            #expect(head.status == 200)
            #expect(head.header("content-type") == "text/event-stream")
            let first = try #require(try await connection.readBodyPart())
            #expect(String(buffer: first).contains("\"index\": 0"))
            // Ordering, not timing: the first event arrived while the backend still had events to send.
            #expect(fixture.backend.record.eventsSent < 20)
            var rest = ByteBuffer()
            while var part = try await connection.readBodyPart() { rest.writeBuffer(&part) }
            let text = String(buffer: rest)
            for index in 1..<20 { #expect(text.contains("\"index\": \(index)")) }
            await connection.close()
        }
    }

    @Test("a streamed body of any content type is flushed piece by piece, for POST too")
    func nonSSEStreamIsNotBuffered() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest(
                "POST",
                "/plain?n=20&interval_ms=\(TestTiming.scaled(milliseconds: 100))",
                body: ByteBuffer(string: "{}")
            )
            let head = try await connection.readHead()
            #expect(head.header("content-type") == "application/octet-stream")
            let first = try #require(try await connection.readBodyPart())
            #expect(String(buffer: first) == "chunk 0\n")
            #expect(fixture.backend.record.eventsSent < 20)
            _ = try await connection.drainBody()
            await connection.close()
        }
    }

    @Test("64 MiB down arrive intact, with Content-Length and chunked", .clusterAlone)
    func largeDownload() async throws {
        try await ProxyFixture.with { fixture in
            let size = 64 * 1024 * 1024
            let expected = SHA256.hash(data: TestBackend.pattern(size: size))
            for path in ["/bytes?size=\(size)", "/bytes?size=\(size)&chunked=1"] {
                let connection = try await fixture.connect()
                try await connection.sendRequest("GET", path)
                let head = try await connection.readHead()
                #expect(head.status == 200)
                var hash = SHA256()
                var count = 0
                while let part = try await connection.readBodyPart() {
                    part.withUnsafeReadableBytes { hash.update(bufferPointer: $0) }
                    count += part.readableBytes
                }
                #expect(count == size)
                #expect(hash.finalize() == expected)
                await connection.close()
            }
        }
    }

    @Test("24 MiB up arrive intact, with Content-Length and chunked", .clusterAlone)
    func largeUpload() async throws {
        try await ProxyFixture.with { fixture in
            let size = 24 * 1024 * 1024
            let payload = ByteBuffer(bytes: TestBackend.pattern(size: size))
            let digest = SHA256.hash(data: TestBackend.pattern(size: size)).map { String(format: "%02x", $0) }.joined()

            let connection = try await fixture.connect()
            try await connection.sendRequest("POST", "/upload", body: payload)
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "{\"bytes\":\(size),\"sha256\":\"\(digest)\"}")

            // Same connection (keep-alive), now chunked in 1 MiB chunks.
            try await connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
            var offset = 0
            while offset < size {
                let length = min(1024 * 1024, size - offset)
                var chunk = ByteBuffer(string: String(length, radix: 16) + "\r\n")
                chunk.writeImmutableBuffer(payload.getSlice(at: offset, length: length)!)
                chunk.writeString("\r\n")
                try await connection.send(chunk)
                offset += length
            }
            try await connection.send("0\r\n\r\n")
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "{\"bytes\":\(size),\"sha256\":\"\(digest)\"}")
            await connection.close()
        }
    }

    @Test(
        "a WebSocket upgrade passes through, including bytes the backend sends with its 101",
        arguments: [false, true]
    )
    func webSocketUpgradePassesThrough(tls: Bool) async throws {
        try await ProxyFixture.with(tls: tls) { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest(
                "GET",
                "/ws",
                headers: [("Connection", "Upgrade"), ("Upgrade", "websocket"), ("Sec-WebSocket-Version", "13")]
            )
            let head = try await connection.readHead()
            #expect(head.status == 101)
            #expect(head.header("upgrade")?.lowercased() == "websocket")
            try await connection.send("ping 1\n")
            var received = ""
            while !received.contains("ping 1\n") {
                received += String(buffer: try await connection.readRaw())
            }
            #expect(received.hasPrefix("hello\n"))
            await connection.close()
        }
    }

    @Test("keep-alive: several requests share one client connection and one backend connection")
    func keepAliveReusesConnections() async throws {
        try await ProxyFixture.with(configure: { $0.proxy.backendMaxConnections = 1 }) { fixture in
            let connection = try await fixture.connect()
            for _ in 0..<5 {
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                #expect(String(buffer: try await connection.readBody()) == "ok")
            }
            #expect(fixture.backend.record.connectionsAccepted == 1)
            await connection.close()
        }
    }

    @Test("pipelined requests sent in one write are answered in order")
    func pipelinedRequests() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.send(
                "GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /headers HTTP/1.1\r\nHost: x\r\nX-Second: 1\r\n\r\n"
                    + "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "ok")
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()).contains("x-second: 1"))
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()) == "ok")
            await connection.close()
        }
    }

    @Test("Connection: close is honoured after a complete response, and the backend connection is kept for reuse")
    func connectionClose() async throws {
        // The pool's idle timeout (4 s in tests) is made long: on a loaded machine the three rounds took 12 s, the
        // pool rightly closed its idle connection between two of them, and the count said "not reused".
        try await ProxyFixture.with(configure: {
            $0.proxy.backendMaxConnections = 1
            $0.proxy.backendIdleTimeout = .seconds(120)
        }) { fixture in
            for _ in 0..<3 {
                let connection = try await fixture.connect()
                try await connection.sendRequest("GET", "/health", headers: [("Connection", "close")])
                let head = try await connection.readHead()
                #expect(head.status == 200)
                #expect(head.header("connection") == "close")
                #expect(String(buffer: try await connection.readBody()) == "ok")
                #expect(await connection.isClosedByPeer())
            }
            #expect(fixture.backend.record.connectionsAccepted <= System.coreCount)
        }
    }

    @Test("an HTTP/1.0 request without Host reaches the backend with one")
    func http10WithoutHost() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.send("GET /headers HTTP/1.0\r\n\r\n")
            let head = try await connection.readHead()
            #expect(head.status == 200)
            let text = String(buffer: try await connection.readBody())
            #expect(text.contains("host: 127.0.0.1:\(fixture.backend.port)"))
            #expect(await connection.isClosedByPeer())
        }
    }

    @Test("Expect: 100-continue is answered by the gateway, and the body then goes through")
    func expectContinue() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.send(
                "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"
            )
            #expect(try await connection.readHead().status == 100)
            try await connection.send("hello")
            #expect(try await connection.readHead().status == 200)
            #expect(String(buffer: try await connection.readBody()).hasPrefix("{\"bytes\":5,"))
            #expect(!fixture.backend.record.lastHeaders.contains { $0.0.lowercased() == "expect" })
            await connection.close()
        }
    }
}
