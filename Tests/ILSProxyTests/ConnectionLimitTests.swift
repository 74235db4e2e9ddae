import ILSCore
import ILSFabric
import ILSGateway
import ILSTesting
import NIOCore
import Testing

@Suite("HTTP mode's connection caps")
struct ConnectionLimitTests {
    @Test(
        "beyond a cap a client connection is closed at accept and the backend hears nothing; a slot frees on close",
        arguments: [
            ConnectionLimiter.Limits(total: 100, perSource: 3),
            ConnectionLimiter.Limits(total: 3, perSource: 100),
        ]
    )
    func capsRefuseAtAccept(limits: ConnectionLimiter.Limits) async throws {
        try await ProxyFixture.with(tls: true, configure: { $0.connectionLimits = limits }) { fixture in
            var held: [TestHTTPConnection] = []
            for _ in 0..<3 {
                let connection = try await fixture.connect()
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.drainBody()
                held.append(connection)
            }
            let backendConnections = fixture.backend.record.connectionsAccepted
            for _ in 0..<3 {
                // Closed at accept: the TLS handshake fails, and the request gets no answer at all.
                let refused = try await fixture.connect()
                // The bound on the wait for the close: a connection still open then fails the test, not passes it.
                let timer = Task {
                    try await Task.sleep(for: .seconds(10) * Int(TestTiming.scale))
                    Issue.record("a connection beyond the cap was neither answered nor closed")
                    await refused.close()
                }
                try? await refused.sendRequest("GET", "/health")
                let status = try? await refused.readHead().status
                timer.cancel()
                #expect(status == nil, "a connection beyond the cap was answered \(status.map(String.init) ?? "")")
            }
            #expect(fixture.backend.record.connectionsAccepted == backendConnections)
            // The held keep-alive connections still serve.
            try await held[0].sendRequest("GET", "/health")
            #expect(try await held[0].readHead().status == 200)
            _ = try await held[0].drainBody()
            await held.removeLast().close()
            var served = false
            for _ in 0..<100 where !served {
                if let connection = try? await fixture.connect() {
                    try? await connection.sendRequest("GET", "/health")
                    served = (try? await connection.readHead().status) == 200
                    await connection.close()
                }
                if !served { try await Task.sleep(for: .milliseconds(50)) }
            }
            #expect(served, "no client was served after a held connection closed")
            for connection in held { await connection.close() }
        }
    }
}
