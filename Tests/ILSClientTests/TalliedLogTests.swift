import ILSCore
import ILSDial
import ILSFabric
import ILSTesting
import NIOCore
import Testing

/// Events a peer can repeat as fast as it likes are logged once a minute per key with their count (`LogTally`):
/// 300 resumptions made 300 gateway lines, and a disabled identity's tunnel that redialled made 357 controller lines
/// in 22 s (issue 49). What a cluster logs at notice and above is captured (`TestCluster.capturedLog`).
@Suite("Resumptions and refused overlay connections are tallied in the log", .clusterExclusive)
struct TalliedLogTests {
    @Test("300 resumptions of one device make one gateway line; the metric counts all 300", .clusterAlone)
    func resumptionsAreTallied() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let gateway = cluster.gateways[0]
            let dialer = try OverlayDialer(identity: identity)
            // 60 circuits (under the gateway's 64 held per identity), each resumed 5 times.
            var circuits: [any Channel] = []
            for _ in 0..<60 {
                let circuit = try await dialer.dial(service: "claude-api").get()
                try await circuit.writeAndFlush(
                    ByteBuffer(string: "GET /sse?n=100000&interval_ms=500 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
                )
                circuits.append(circuit)
            }
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 60 })
            for round in 1...5 {
                cluster.controller.dropConnections(identityID: identity.identity.id)
                #expect(await TestCluster.eventually { gateway.resumedCount == 60 * round }, "round \(round)")
            }
            let lines = cluster.capturedLog.filter { $0.contains("circuit resumed") }
            #expect(lines.count == 1, "\(lines)")
            #expect(lines.allSatisfy { $0.contains("since_last_line=1") && $0.contains(identity.identity.id) })
            for circuit in circuits { try await circuit.close() }
        }
    }

    @Test("300 refused overlay connections of a disabled identity make one controller line")
    func refusedConnectionsAreTallied() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/tab/disable")
            // A dialer per connection, as a tunnel that redials would make them; 20 at a time.
            var refused = 0
            for _ in 0..<15 {
                try await withThrowingTaskGroup(of: Bool.self) { group in
                    for _ in 0..<20 {
                        group.addTask {
                            let dialer = try OverlayDialer(identity: identity)
                            do {
                                _ = try await dialer.dial(service: "claude-api").get()
                                return false
                            } catch OverlayDialer.DialError.refused(code: "identity_blocked", _) {
                                return true
                            }
                        }
                    }
                    for try await wasRefused in group where wasRefused { refused += 1 }
                }
            }
            #expect(refused == 300)
            let lines = cluster.capturedLog.filter { $0.contains("overlay connection refused") }
            #expect(lines.count == 1, "\(lines)")
            #expect(lines.allSatisfy { $0.contains("since_last_line=1") && $0.contains("disabled") })
        }
    }
}
