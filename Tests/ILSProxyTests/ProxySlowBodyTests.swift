import ILSCore
import ILSTesting
import NIOCore
import Testing

@Suite("Request bodies that stall (slowloris on the body)")
struct ProxySlowBodyTests {
    @Test("an upload that stops mid-body gets 408 request_timeout after the idle timeout, and the connection closes")
    func stalledBodyIsCut() async throws {
        try await ProxyFixture.with(configure: { $0.proxy.clientIdleTimeout = .seconds(1) }) { fixture in
            // Sent by the event loop on connect: from the test's task, a loaded machine could let the idle timeout
            // close the connection before the request starts (then the write fails instead of the body stalling).
            let connection = try await fixture.connect(
                firstBytes: "POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789"
            )
            let clock = ContinuousClock()
            let started = clock.now
            let head = try await connection.readHead()
            #expect(head.status == 408)
            #expect(head.header("content-type") == "application/json")
            #expect(String(buffer: try await connection.readBody()).contains("\"code\":\"request_timeout\""))
            #expect(await connection.isClosedByPeer())
            #expect(clock.now - started < .seconds(30))
        }
    }

    @Test("an upload that is slow but keeps moving is never cut by the idle timeout")
    func slowMovingBodyCompletes() async throws {
        // Scaled: under ASan with the suite in parallel, one 200 ms gap once stretched past an unscaled 3 s.
        let idle = TestTiming.scaled(TimeSpan.seconds(3))
        try await ProxyFixture.with(configure: { $0.proxy.clientIdleTimeout = idle }) { fixture in
            let connection = try await fixture.connect()
            let pieces = 20
            try await connection.send("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: \(pieces)\r\n\r\n")
            // 20 pieces 200 ms apart: the whole body takes longer than the idle timeout, each gap far less (a loaded
            // machine may stretch a gap several times over and still stay under it).
            for _ in 0..<pieces {
                // Sleep: the gaps of a body that keeps moving are what the idle timeout must not cut.
                try await Task.sleep(for: .milliseconds(200))
                try await connection.send("x")
            }
            let head = try await connection.readHead()
            #expect(head.status == 200)
            _ = try await connection.readBody()
            await connection.close()
        }
    }
}
