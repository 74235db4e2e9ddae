import Foundation
import ILSClient
import ILSCore
import ILSFabric
import ILSTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Issue 39, nothing spent while idle: with no circuit open a device's controller connection sends no PING and is
/// closed after the idle time; the next request connects again. (The PINGs themselves: `KeepaliveHandlerTests`; the
/// silence counted on a namespace's interface: e2e `test_idle.py`.)
@Suite("An idle device closes its controller connection", .clusterExclusive)
struct IdleConnectionTests {
    @Test("the connection stays up while a circuit is open, closes once none is, and the next request reconnects")
    func idleCloses() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            // Shorter than the answer below: the connection must outlive the idle time while a circuit is open.
            let dialer = try OverlayDialer(
                identity: identity,
                idle: FabricKeepalive.Idle(closeAfter: .milliseconds(200))
            )
            let client = OverlayClient(dialer: dialer)
            let response = try await client.stream(
                URLRequest(url: URL(string: "http://claude-api/sse?n=6&interval_ms=150")!)
            )
            var received = ""
            for try await chunk in response.body { received += String(decoding: chunk, as: UTF8.self) }
            #expect(sseData(received).count == 6, "the circuit was cut: \(received)")

            #expect(await TestCluster.eventually { !dialer.holdsConnection }, "the idle connection was kept")
            let next = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            #expect(next.response.statusCode == 200)
        }
    }

    @Test("without an idle close the connection stays open between requests")
    func keptWithoutIdleClose() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let dialer = try OverlayDialer(identity: identity, idle: FabricKeepalive.Idle(closeAfter: nil))
            let client = OverlayClient(dialer: dialer)
            let response = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            for try await _ in response.body {}
            #expect(response.response.statusCode == 200)
            // Ordering, not time: a second request's circuit is made on the connection the first left open.
            #expect(dialer.holdsConnection)
            let next = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            #expect(next.response.statusCode == 200)
            #expect(dialer.holdsConnection)
        }
    }
}
