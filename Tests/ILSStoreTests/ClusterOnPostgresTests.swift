import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSCrypto
import ILSStore
import ILSStorePostgres
import ILSTesting
import Testing

/// Two controllers on one PostgreSQL, a gateway linked to both, devices on either: what several controllers must
/// keep true.
@Suite("Two controllers on one PostgreSQL", .serialized, .timeLimit(.minutes(3)), .clusterExclusive)
struct ClusterOnPostgresTests {
    private static func cluster() async throws -> (TestCluster, ControllerAddress) {
        // A fresh database for each try (a retry on another port initializes again); `stop` closes the store: an
        // open client's pool would outlive the test.
        let cluster = try await TestCluster.start(gateways: 1) {
            try await PostgresControllerStore(url: try TestPostgres.shared().createDatabase(), logger: StoreKind.logger)
        }
        let replica = try await cluster.startReplica()
        return (cluster, replica)
    }

    @Test("of two enrollments with one token racing through two controllers, exactly one wins")
    func tokenRace() async throws {
        let (cluster, _) = try await Self.cluster()
        let created: ControllerAPI.TokenResponse = try await cluster.admin().call(
            .POST,
            "/v1/admin/identities",
            body: ControllerAPI.CreateIdentityRequest(
                name: "race",
                role: .device,
                attributes: [],
                tokenLifetimeSeconds: 600
            )
        )
        let controllers = [Controller(state: cluster.state), Controller(state: cluster.replicas[0].state)]
        let now = Int64(Date().timeIntervalSince1970)
        let outcomes = await withTaskGroup(of: String.self) { group in
            for round in 0..<10 {
                let controller = controllers[round % 2]
                let request = EnrollmentProof.makeRequest(token: created.token, keyPair: IdentityKeyPair.generate())
                group.addTask {
                    do throws(ILSError) {
                        _ = try await controller.enroll(request, now: now)
                        return "won"
                    } catch {
                        return error.code.name
                    }
                }
            }
            return await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(outcomes.filter { $0 == "won" }.count == 1, "\(outcomes)")
        #expect(outcomes.filter { $0 == EnrollmentRefusal.used.rawValue }.count == 9, "\(outcomes)")
        await Self.finish(cluster)
    }

    @Test("a device revoked through controller A has its live stream on controller B cut")
    func revocationReachesTheOtherController() async throws {
        let (cluster, replica) = try await Self.cluster()
        // The gateway learns B from A's push and links to it.
        #expect(
            await TestCluster.eventually {
                cluster.gateways[0].linkedControllers.contains(replica)
            }
        )
        var tablet = try await cluster.enroll("tablet", role: .device)
        tablet.controller = replica.description
        tablet.controllers = []
        let port = try await cluster.startTunnel(identity: tablet)
        let stream = try await TestHTTPConnection(port: port)
        try await stream.sendRequest("GET", "/sse?n=100000&interval_ms=50")
        #expect(try await stream.readHead().status == 200)
        _ = try await stream.readBodyPart()
        // The circuit is on B, not A.
        #expect(cluster.replicas[0].server.splices.sameLoop + cluster.replicas[0].server.splices.crossLoop == 1)
        let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/tablet/revoke")
        #expect(await stream.isClosedByPeer())
        // B heard it from the store's feed (no maintenance pass runs here): its own directory says revoked, so B
        // refuses the device's next connection and circuit itself, whatever the gateway knows.
        let replicaState = cluster.replicas[0].state
        #expect(
            await TestCluster.eventually {
                replicaState.identities.identity(named: "tablet")?.state == .revoked
            }
        )
        await Self.finish(cluster)
    }

    private static func finish(_ cluster: TestCluster) async {
        await cluster.stop()
    }
}
