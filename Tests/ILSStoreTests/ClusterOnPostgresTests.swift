import Foundation
import ILSController
import ILSCore
import ILSCrypto
import ILSIdentity
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

    @Test(
        "with controller A's change feed stalled, no request sent after a narrowing through B returns gets in through A: attribute removal and policy change"
    )
    func narrowingFailsClosedUnderAStalledFeed() async throws {
        let server = try TestPostgres.shared()
        let url = try server.createDatabase()
        let database = TestPostgres.databaseName(url)
        // A's feed is never replaced during the test: its probe would notice the stall only after ten minutes, so A's
        // directory stays as it was when the feed stopped (checked at the end).
        let cluster = try await TestCluster.start(gateways: 1) {
            try await PostgresControllerStore(
                url: url,
                logger: StoreKind.logger,
                feedProbe: ChangeFeedProbe(interval: .seconds(600), bound: .seconds(10))
            )
        }
        let listenersOfA = try server.listeningProcesses(database: database)
        try #require(listenersOfA.count == 1, "A listens on one connection: \(listenersOfA)")
        // B has a store object, pool and feed of its own, as a replica in another process has.
        let replica = try await cluster.startReplica(
            store: try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        )
        #expect(await TestCluster.eventually { cluster.gateways[0].linkedControllers.contains(replica) })

        let adminA = try cluster.admin()
        let adminB = try cluster.admin(through: replica)
        try await Self.setDial(["#team"], through: adminA)
        // Two devices pinned to A: one loses its attribute, the other the policy that let it in.
        var tunnels: [String: Int] = [:]
        for name in ["tablet", "laptop"] {
            var file = try await cluster.enroll(name, role: .device, attributes: ["team"])
            file.controller = "https://127.0.0.1:\(cluster.controllerPort)"
            file.controllers = []
            tunnels[name] = try await cluster.startTunnel(identity: file)
        }
        // B heard all of it through its own feed before A's stops.
        #expect(await cluster.replicaHeard(identity: "laptop", attributes: ["team"], dial: "anyOf(#team)"))
        try server.signal(SIGSTOP, process: listenersOfA[0])
        defer { try? server.signal(SIGCONT, process: listenersOfA[0]) }

        let backend = cluster.backend.record
        for (device, narrowing) in [("tablet", "attribute"), ("laptop", "policy")] {
            let probes = Self.probes(port: tunnels[device] ?? 0, tag: device)
            let probing = Task { await probes.run() }
            // The device gets in through A before the change: the probes are real.
            #expect(await TestCluster.eventually { probes.admitted > 0 })
            if narrowing == "attribute" {
                let _: IdentityRecord = try await adminB.call(
                    .PUT,
                    "/v1/admin/identities/tablet/attributes",
                    body: ControllerAPI.AttributesRequest(attributes: [])
                )
            } else {
                try await Self.setDial(["#other"], through: adminB)
            }
            // Every probe numbered from here on was sent after the command returned.
            let fence = probes.fence()
            #expect(await TestCluster.eventually { probes.finished(after: fence) >= 30 })
            probing.cancel()
            _ = await probing.value
            let late = probes.admittedNumbers.filter { $0 >= fence }
            #expect(late.isEmpty, "\(narrowing) narrowing: probes \(late) sent after it returned were admitted")
            let reached = backend.targets.compactMap { target -> Int? in
                guard target.hasPrefix("/health?probe=\(device)-") else { return nil }
                return Int(target.dropFirst("/health?probe=\(device)-".count))
            }
            #expect(!reached.contains { $0 >= fence }, "the backend saw \(device)'s probes from #\(fence) on")
        }
        // B goes away: its narrowed grant stays in force at the gateway (B may be the only controller that knows of
        // the narrowing); A's stale grant alone would let the tablet in again.
        await cluster.replicas[0].server.shutdown()
        #expect(await TestCluster.eventually { !cluster.gateways[0].linkedControllers.contains(replica) })
        let after = Self.probes(port: tunnels["tablet"] ?? 0, tag: "after")
        let probing = Task { await after.run() }
        #expect(await TestCluster.eventually { after.finished(after: 0) >= 10 })
        probing.cancel()
        _ = await probing.value
        #expect(after.admitted == 0, "with B gone, A's stale grant let the tablet in \(after.admitted) times")
        // A's feed was stalled throughout: its own directory never heard either narrowing.
        #expect(cluster.state.identities.identity(named: "tablet")?.attributes == ["team"])
        #expect(cluster.state.identities.service(named: "claude-api")?.dial.description == "anyOf(#team)")
        await Self.finish(cluster)
    }

    /// Sets `claude-api`'s dial policy to `anyOf(tokens)` through the controller `admin` calls.
    private static func setDial(_ tokens: [String], through admin: ControllerClient) async throws {
        let current: ControllerAPI.ServiceInfo = try await admin.call(.GET, "/v1/admin/services/claude-api")
        let _: ControllerAPI.ServiceInfo = try await admin.call(
            .PUT,
            "/v1/admin/services/claude-api",
            body: ControllerAPI.ServiceRequest(
                dial: ControllerAPI.PolicyText(semantic: .anyOf, tokens: tokens),
                revision: current.revision
            )
        )
    }

    /// Probes through one tunnel: each a request on a new connection (so a new circuit), numbered in the target
    /// (`/health?probe=<tag>-<n>`), admitted when the backend answered 200.
    private static func probes(port: Int, tag: String) -> NumberedProbes {
        NumberedProbes { number in
            do {
                let connection = try await TestHTTPConnection(port: port)
                defer { Task { await connection.close() } }
                try await connection.sendRequest("GET", "/health?probe=\(tag)-\(number)")
                return try await connection.readHead().status == 200
            } catch {
                return false
            }
        }
    }

    private static func finish(_ cluster: TestCluster) async {
        await cluster.stop()
    }
}
