import Crypto
import Foundation
import ILSClient
import ILSCore
import ILSFabric
import ILSTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Circuit resumption through a real controller, gateway and backend in process: the device's connections are
/// dropped by the controller (as a network that loses them would), and the circuit goes on over a new one.
/// The same over real network faults (namespaces, iptables DROP, SIGSTOP) is `Tests/e2e/test_resumption.py`.
@Suite("Circuit resumption: an answer survives a lost path", .clusterExclusive)
struct ResumptionTests {
    static func events(_ count: Int) -> [String] { (0..<count).map { #"{"index": \#($0)}"# } }

    @Test(
        "an SSE answer survives its device's connection dropping mid-stream: every event once, in order; the backend saw one request, never cancelled"
    )
    func sseSurvivesADroppedConnection() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let client = try OverlayClient(identity: identity)
            let response = try await client.stream(
                URLRequest(url: URL(string: "http://claude-api/sse?n=60&interval_ms=20")!)
            )
            var received = ""
            var sentWhenDropped: Int?
            for try await chunk in response.body {
                received += String(decoding: chunk, as: UTF8.self)
                if sentWhenDropped == nil, sseData(received).count >= 5 {
                    sentWhenDropped = cluster.backend.record.eventsSent
                    cluster.controller.dropConnections(identityID: identity.identity.id)
                }
            }
            #expect(try #require(sentWhenDropped) < 60, "the connection dropped after the answer ended")
            #expect(sseData(received) == Self.events(60))
            #expect(await TestCluster.eventually { cluster.gateways[0].resumableCircuits.registered == 0 })
            #expect(cluster.backend.record.targets.filter { $0.hasPrefix("/sse") }.count == 1)
            #expect(cluster.backend.record.streamsCompleted == 1)
            #expect(cluster.backend.record.streamsDisconnected == 0)
            #expect(cluster.gateways[0].resumedCount == 1)
        }
    }

    @Test("a 16 MiB upload survives its device's connection dropping midway: the backend hashes every byte once")
    func uploadSurvivesADroppedConnection() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let client = try OverlayClient(identity: identity)
            let size = 16 * 1024 * 1024
            let body = TestBackend.pattern(size: size)
            var request = URLRequest(url: URL(string: "http://claude-api/upload")!)
            request.httpMethod = "POST"
            let dropper = Task {
                // Once a quarter of the body has reached the backend, not before.
                _ = await TestCluster.eventually { cluster.backend.record.bytesReceived >= size / 4 }
                cluster.controller.dropConnections(identityID: identity.identity.id)
                return cluster.backend.record.bytesReceived
            }
            request.httpBody = Data(body)
            let response = try await client.stream(request)
            var answer = Data()
            for try await chunk in response.body { answer += chunk }
            let receivedWhenDropped = await dropper.value
            #expect(receivedWhenDropped < size, "the connection dropped after the upload ended")
            let hash = SHA256.hash(data: body).map { String(format: "%02x", $0) }.joined()
            #expect(String(decoding: answer, as: UTF8.self) == "{\"bytes\":\(size),\"sha256\":\"\(hash)\"}")
            #expect(cluster.gateways[0].resumedCount == 1)
        }
    }

    /// A cluster whose one gateway keeps circuits for resumption as `retention` says.
    static func withGateway(
        retention: CircuitRetention,
        _ body: (TestCluster, TestBackend) async throws -> Void
    ) async throws {
        let cluster = try await TestCluster.start(gateways: 0)
        do {
            try await body(cluster, try await cluster.addGateway(name: "gw1", retention: retention))
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }

    /// Streams an endless SSE answer through `client`, drops the device's connections at the controller after the
    /// third event, and returns how the stream failed.
    static func streamUntilDropped(_ client: OverlayClient, cluster: TestCluster, identity: IdentityFile) async
        -> URLError?
    {
        await #expect(throws: URLError.self) {
            let response = try await client.stream(
                URLRequest(url: URL(string: "http://claude-api/sse?n=100000&interval_ms=10")!)
            )
            var received = ""
            for try await chunk in response.body {
                received += String(decoding: chunk, as: UTF8.self)
                if sseData(received).count == 3 {
                    cluster.controller.dropConnections(identityID: identity.identity.id)
                }
            }
        }
    }

    @Test(
        "a gateway that no longer holds the circuit refuses its resumption: the app's stream ends with not_resumed, not truncated"
    )
    func notHeldIsNotResumed() async throws {
        // Grace 0: this gateway ends a circuit with its path, as before resumption.
        try await Self.withGateway(retention: CircuitRetention(grace: .zero)) { cluster, backend in
            let identity = try await cluster.enroll("tab", role: .device)
            let failure = await Self.streamUntilDropped(
                try OverlayClient(identity: identity),
                cluster: cluster,
                identity: identity
            )
            #expect(failure?.userInfo[OverlayURLError.reasonKey] as? String == "not_resumed")
            #expect(failure?.code == .networkConnectionLost)
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            #expect(cluster.gateways[0].resumedCount == 0 && cluster.gateways[0].expiredCount == 0)
        }
    }

    @Test(
        "after the grace window the gateway cancels the backend request and keeps nothing: no circuit, no retained byte"
    )
    func graceRunsOut() async throws {
        let retention = CircuitRetention(
            grace: .milliseconds(300),
            budget: RetentionBudget(limit: CircuitRetention.defaultTotal)
        )
        try await Self.withGateway(retention: retention) { cluster, backend in
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            // A device that does not resume (grace 0): the gateway holds its circuit alone, then gives it up.
            let dialer = try OverlayDialer(identity: identity, retention: CircuitRetention(grace: .zero))
            let failure = await Self.streamUntilDropped(
                OverlayClient(dialer: dialer),
                cluster: cluster,
                identity: identity
            )
            #expect(failure?.userInfo[OverlayURLError.reasonKey] as? String == "truncated")
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            // It was held, and let go because its window ran out, not with its path.
            #expect(gateway.expiredCount == 1)
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(gateway.retainedBytes == 0)
        }
    }
}
