import ILSGateway
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import Testing

@Suite("Bounded resources in HTTP mode")
struct ProxyResourceTests {
    @Test("a client that stops reading a huge response stops the backend too, and memory stays flat")
    func slowReaderBackpressure() async throws {
        try await ProxyFixture.with { fixture in
            let size = 512 * 1024 * 1024
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/bytes?size=\(size)")
            #expect(try await connection.readHead().status == 200)
            var received = 0
            while received < 1024 * 1024, let part = try await connection.readBodyPart() {
                received += part.readableBytes
            }
            // Stop reading. Without backpressure the gateway would pull the whole response off loopback meanwhile
            // and hold it in memory; with it, the backend is blocked within a few socket buffers of the reader.
            // (Resident memory of the real gateway process is sampled in the end-to-end test; this process also
            // runs other tests, so its own RSS says little.) The event: the gateway holds its read of the backend
            // connection, and from then on takes nothing more off it.
            #expect(await eventually { fixture.gateway.heldBackendReads == 1 })
            let writtenWhilePaused = fixture.backend.record.bytesWritten
            #expect(
                writtenWhilePaused < 32 * 1024 * 1024,
                "backend wrote \(writtenWhilePaused) bytes to a stalled reader"
            )
            // Read slowly for a while: the backend stays just ahead of the reader, never far ahead.
            for _ in 0..<50 {
                guard let part = try await connection.readBodyPart() else { break }
                received += part.readableBytes
                // Sleep: the gaps between reads are the slow reader the backend must stay just ahead of.
                try await Task.sleep(for: .milliseconds(2))
            }
            #expect(fixture.backend.record.bytesWritten - received < 32 * 1024 * 1024)
            received += try await connection.drainBody()
            #expect(received == size)
        }
    }

    @Test("at the backend connection limit, a request waits for a free connection instead of opening another")
    func poolIsBounded() async throws {
        try await ProxyFixture.with(configure: { $0.proxy.backendMaxConnections = 1 }) { fixture in
            // One loop per core shares the limit; the pool rounds up to one connection per loop.
            let first = try await fixture.connect()
            try await first.sendRequest("GET", "/sse?n=3&interval_ms=100")
            #expect(try await first.readHead().status == 200)
            let second = try await fixture.connect()
            try await second.sendRequest("GET", "/health")
            #expect(try await second.readHead().status == 200)
            _ = try await second.readBody()
            _ = try await first.readBody()
            #expect(fixture.backend.record.connectionsAccepted <= System.coreCount)
            await first.close()
            await second.close()
        }
    }

    @Test("graceful shutdown lets an in-flight stream finish and refuses new connections")
    func gracefulShutdownDrains() async throws {
        try await ProxyFixture.with { fixture in
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/sse?n=5&interval_ms=100")
            #expect(try await connection.readHead().status == 200)
            async let shutdown: Void = fixture.gateway.shutdown()
            let text = String(buffer: try await connection.readBody())
            #expect(text.contains("\"index\": 4"))
            await shutdown
            await #expect(throws: (any Error).self) { _ = try await fixture.connect() }
        }
    }

    @Test(
        "a client that stops reading altogether is cut off after the stall timeout, and so is its backend request; the access line says client_stalled, and the stall is counted"
    )
    func stalledClientIsCutOff() async throws {
        let lines = AccessLogTests.Sink()
        let stalls = NIOLockedValueBox(0)
        let configure: (inout HTTPModeConfiguration) -> Void = {
            $0.proxy.clientStallTimeout = .milliseconds(500)
            $0.proxy.accessLog = lines
            $0.proxy.clientStalled = { stalls.withLockedValue { $0 += 1 } }
        }
        try await ProxyFixture.with(configure: configure) { fixture in
            let size = 256 * 1024 * 1024
            let connection = try await fixture.connect()
            try await connection.sendRequest("GET", "/bytes?size=\(size)")
            #expect(try await connection.readHead().status == 200)
            _ = try await connection.readBodyPart()
            // Stop reading until the stall timeout has cut the client and its backend request: the backend sees its
            // connection end.
            #expect(
                await eventually {
                    fixture.backend.record.connectionsClosed == 1
                }
            )
            // What was in flight still arrives, then the connection ends long before the body would.
            var received = 0
            do {
                while let part = try await connection.readBodyPart() { received += part.readableBytes }
                Issue.record("the whole body arrived: the stalled client was never cut off")
            } catch {
                #expect(received < size)
            }
            #expect(stalls.withLockedValue { $0 } == 1)
            let outcomes = lines.lines.withLockedValue { $0 }.map { line in line.first { $0.key == "outcome" }?.value }
            #expect(outcomes == ["client_stalled"])
        }
    }

    @Test("an idle backend connection is reused at once, and closed by the pool after the backend idle timeout")
    func idleBackendConnectionsAreSwept() async throws {
        try await ProxyFixture.with(configure: { $0.proxy.backendIdleTimeout = TestTiming.scaled(.seconds(2)) }) {
            fixture in
            let connection = try await fixture.connect()
            for _ in 0..<2 {
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
            }
            #expect(fixture.backend.record.connectionsAccepted == 1)
            #expect(fixture.backend.record.connectionsClosed == 0)
            // Past the timeout the pool's sweep closes the idle connection (the backend sees it end), so the next
            // request needs a new one.
            #expect(
                await eventually {
                    fixture.backend.record.connectionsClosed == 1
                }
            )
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            _ = try await connection.readBody()
            #expect(fixture.backend.record.connectionsAccepted == 2)
            await connection.close()
        }
    }
}
