import Foundation
import ILSClient
import ILSCore
import ILSFabric
import ILSTesting
import Testing

#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// Two controller replicas in one process sharing one store (`TestCluster.startReplica`): A is the cluster's first
/// controller, B the replica. Every identity of these tests is enrolled through A.
@Suite("Controller replicas: devices, tunnels and gateways know every controller", .clusterExclusive)
struct ReplicaTests {
    /// The cluster's first controller.
    static func first(_ cluster: TestCluster) throws -> ControllerAddress {
        try ControllerAddress(parsing: "https://127.0.0.1:\(cluster.controllerPort)")
    }

    /// `GET /health` through the tunnel on `port`, on a connection of its own; the response status.
    static func health(tunnel port: Int) async throws -> Int {
        let connection = try await TestHTTPConnection(port: port)
        try await connection.sendRequest("GET", "/health", headers: [("Connection", "close")])
        let status = try await connection.readHead().status
        await connection.close()
        return status
    }

    @Test("an enrollment through one controller names every replica, and a gateway links to a replica it is told of")
    func enrollmentAndGatewayLearnReplicas() async throws {
        try await withCluster { cluster in
            let a = try Self.first(cluster)
            let b = try await cluster.startReplica()

            let phone = try await cluster.enroll("phone", role: .device)
            #expect(phone.controller == a.description)
            #expect(phone.controllers == [a.description, b.description])
            let written = try IdentityFileIO.read("\(cluster.directory)/identities/phone.json")
            #expect(written.controllers == [a.description, b.description])

            // The gateway was enrolled before B existed: its file names A only, so it can learn B only from A.
            let gateway = cluster.gateways[0]
            #expect(await TestCluster.eventually { gateway.linkedControllers == [a, b] })
            #expect(gateway.listedControllers == [a, b])

            // A device that knows only B reaches the service: B's relay has a link of the gateway's.
            try await cluster.syncReplicas()
            var onlyB = phone
            onlyB.controller = b.description
            onlyB.controllers = []
            let port = try await cluster.startTunnel(identity: onlyB)
            #expect(try await Self.health(tunnel: port) == 200)
        }
    }

    @Test("a gateway stops redialling a replica that left the controller list, and keeps its other links")
    func gatewayForgetsRetiredReplica() async throws {
        try await withCluster { cluster in
            let a = try Self.first(cluster)
            let b = try await cluster.startReplica()
            let gateway = cluster.gateways[0]
            #expect(await TestCluster.eventually { gateway.linkedControllers == [a, b] })

            try await cluster.retireReplica(0)
            // The gateway hears the list without B from A's roster push, then drops its redial of B.
            #expect(await TestCluster.eventually { gateway.diallingControllers == [a] })
            #expect(gateway.listedControllers == [a])
            #expect(gateway.linkedControllers == [a])
            #expect(try await Self.health(tunnel: cluster.tunnelPort) == 200)
        }
    }

    @Test("a device whose first controller is down dials through the next one")
    func deviceFailsOverWhenFirstIsDown() async throws {
        try await withCluster { cluster in
            let b = try await cluster.startReplica()
            let phone = try await cluster.enroll("phone", role: .device)
            try await cluster.syncReplicas()
            #expect(await TestCluster.eventually { cluster.gateways[0].linkedControllers.contains(b) })

            await cluster.controller.shutdown()
            let client = try OverlayClient(identity: phone)
            let response = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            #expect(response.response.statusCode == 200)
            for try await _ in response.body {}
            #expect(client.dialer.preferredController == b)
        }
    }

    @Test(
        "a tunnel whose controller goes away mid-circuit resumes it through the next one: its client sees every event once; the next request goes there too"
    )
    func tunnelFailsOverAfterLosingItsController() async throws {
        try await withCluster { cluster in
            let b = try await cluster.startReplica()
            let phone = try await cluster.enroll("phone", role: .device)
            try await cluster.syncReplicas()
            #expect(await TestCluster.eventually { cluster.gateways[0].linkedControllers.contains(b) })
            let port = try await cluster.startTunnel(identity: phone)

            // A live circuit, through A (the file's first controller). A's shutdown takes both halves' paths; the
            // tunnel resumes the circuit through B, where the gateway is linked too, and its client sees a pause.
            let live = try await TestHTTPConnection(port: port)
            try await live.sendRequest("GET", "/sse?n=8&interval_ms=100")
            #expect(try await live.readHead().status == 200)
            let first = try #require(try await live.readBodyPart())
            await cluster.controller.shutdown()
            var body = String(buffer: first)
            while let part = try await live.readBodyPart() { body += String(buffer: part) }
            let events = body.split(separator: "\n").filter { $0.hasPrefix("data: ") }
            #expect(events == (0..<8).map { "data: {\"index\": \($0)}"[...] })
            #expect(cluster.backend.record.streamsCompleted == 1)
            #expect(cluster.backend.record.streamsDisconnected == 0)
            #expect(cluster.gateways[0].resumedCount == 1)

            #expect(try await Self.health(tunnel: port) == 200)
        }
    }

    /// The replica shares a SQLite store with A and has no change feed from it: what A writes reaches B's directory
    /// only when B reads the store. A certificate B has not heard of makes B read that identity first.
    @Test(
        "a replica reads an identity it has not heard of from the store: a new device dials, a new admin calls, a renewal goes through; a device revoked meanwhile is still refused there"
    )
    func replicaLearnsIdentitiesOnFirstSight() async throws {
        try await withCluster { cluster in
            let b = try await cluster.startReplica()
            let replica = cluster.replicas[0].state
            #expect(await TestCluster.eventually { cluster.gateways[0].linkedControllers.contains(b) })

            var tablet = try await cluster.enroll("tablet", role: .device)
            #expect(replica.identities.identity(named: "tablet") == nil)
            tablet.controller = b.description
            tablet.controllers = []
            let port = try await cluster.startTunnel(identity: tablet)
            #expect(try await Self.health(tunnel: port) == 200)
            #expect(replica.identities.identity(named: "tablet")?.state == .active)

            // A new admin's first call, and a renewal, through B.
            var ops = try await cluster.enroll("ops", role: .admin)
            ops.controller = b.description
            ops.controllers = []
            let listed: [IdentityRecord] = try await ControllerClient(identityFile: ops).patient.call(
                .GET,
                "/v1/admin/identities"
            )
            #expect(listed.map(\.name).contains("tablet"))
            let opsPath = "\(cluster.directory)/identities/ops-b.json"
            try IdentityFileIO.write(ops, to: opsPath, overwrite: false)
            let renewed = try await Renewal.renew(path: opsPath)
            #expect(renewed.certificate != ops.certificate)

            // Revoked through A before B ever saw it: B reads the revocation and refuses, with the reason.
            var lost = try await cluster.enroll("lost", role: .device)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/lost/revoke")
            #expect(replica.identities.identity(named: "lost") == nil)
            lost.controller = b.description
            lost.controllers = []
            let lostPort = try await cluster.startTunnel(identity: lost)
            let refused = try await TestHTTPConnection(port: lostPort)
            try await refused.sendRequest("GET", "/health", headers: [("Connection", "close")])
            let head = try await refused.readHead()
            #expect(head.status == 403)
            #expect(replica.identities.identity(named: "lost")?.state == .revoked)
        }
    }

    /// The CLI's and the apps' API client: a controller that cannot be connected to is skipped for the next one its
    /// identity file lists; one that took the connection and then failed is not, so no change is sent twice.
    @Test(
        "the API client asks the next controller when one cannot be reached, and never resends a request one took"
    )
    func apiClientFailsOverOnlyBeforeSending() async throws {
        try await withCluster { cluster in
            let a = try Self.first(cluster)
            let down = try ControllerAddress(parsing: "https://127.0.0.1:\(try TestCluster.freePort())")
            var admin = try IdentityFileIO.read("\(cluster.directory)/identities/admin.json")
            admin.controller = down.description
            admin.controllers = [down.description, a.description]
            let record: IdentityRecord = try await ControllerClient(identityFile: admin).patient.call(
                .GET,
                "/v1/whoami"
            )
            #expect(record.name == "admin")
            // Renewal goes through the same client.
            let path = "\(cluster.directory)/identities/admin-failover.json"
            try IdentityFileIO.write(admin, to: path, overwrite: false)
            #expect(try await Renewal.renew(path: path).certificate != admin.certificate)

            // A controller that accepts the connection and hangs up: the creation may have happened there, so it
            // is not sent to A, and A has no such identity.
            let hangUp = try await TestHangUpServer()
            var renewed = try IdentityFileIO.read(path)
            renewed.controller = "https://127.0.0.1:\(hangUp.port)"
            renewed.controllers = [renewed.controller, a.description]
            let refused = await #expect(throws: ILSError.self) {
                let _: ControllerAPI.TokenResponse = try await ControllerClient(identityFile: renewed).patient.call(
                    .POST,
                    "/v1/admin/identities",
                    body: ControllerAPI.CreateIdentityRequest(
                        name: "twice",
                        role: .device,
                        attributes: [],
                        tokenLifetimeSeconds: 600
                    )
                )
            }
            #expect(refused?.code == .unavailable)
            #expect(hangUp.connectionsAccepted == 1)
            #expect(try await cluster.state.store.identity(named: "twice") == nil)
            await hangUp.stop()
        }
    }

    @Test(
        "an admin file from controller init learns the replica on any call, and revokes through it with the first down"
    )
    func adminFileLearnsTheCluster() async throws {
        try await withCluster { cluster in
            let a = try Self.first(cluster)
            let phone = try await cluster.enroll("phone", role: .device)
            let path = "\(cluster.directory)/identities/admin.json"
            #expect(try IdentityFileIO.read(path).controllers.isEmpty, "controller init wrote no list")
            let b = try await cluster.startReplica()
            // A's list names B once A has read its heartbeat (the event waited for: A's roster).
            #expect(await TestCluster.eventually { cluster.state.roster.announced?.count == 2 })
            let _: [IdentityRecord] = try await ControllerClient(path: path).patient.call(.GET, "/v1/admin/identities")
            let learned = try IdentityFileIO.read(path)
            #expect(Set(learned.controllerAddresses) == [a, b])
            #expect(learned.controller == a.description)
            #expect(learned.certificate == (try IdentityFileIO.read(path)).certificate)

            await cluster.controller.shutdown()
            try await cluster.syncReplicas()
            let revoked: IdentityRecord = try await ControllerClient(path: path).patient.call(
                .POST,
                "/v1/admin/identities/phone/revoke"
            )
            #expect(revoked.state == .revoked && revoked.id == phone.identity.id)
            #expect(cluster.replicas[0].state.identities.identity(named: "phone")?.state == .revoked)
        }
    }

    @Test("a device enrolled before the replica existed learns it on its first circuit and fails over to it")
    func deviceLearnsTheClusterFromACircuit() async throws {
        try await withCluster { cluster in
            let a = try Self.first(cluster)
            let phone = try await cluster.enroll("phone", role: .device)
            #expect(phone.controllers == [a.description])
            let b = try await cluster.startReplica()
            #expect(await TestCluster.eventually { cluster.state.roster.announced?.count == 2 })
            #expect(await TestCluster.eventually { cluster.gateways[0].linkedControllers.contains(b) })
            let stored = FileIdentityStore(path: "\(cluster.directory)/identities/phone-app.json")
            try stored.save(phone)

            // One request through A: its circuit answer names B, and the app's store keeps it. The store is written
            // off the connection's event loop, after the answer (`onControllersLearned`): the test waits for that
            // write, the event, not for the body's end (stop 46's CI read the file a moment before it).
            let client = try OverlayClient(store: stored)
            let response = try await client.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            for try await _ in response.body {}
            #expect(
                await TestCluster.eventually {
                    (try? stored.load()).flatMap { $0.map { Set($0.controllerAddresses) } } == [a, b]
                }
            )

            // A goes away: the next launch, from the store, reaches the service through B.
            await cluster.controller.shutdown()
            try await cluster.syncReplicas()
            let relaunched = try OverlayClient(store: stored)
            let again = try await relaunched.stream(URLRequest(url: URL(string: "http://claude-api/health")!))
            #expect(again.response.statusCode == 200)
            for try await _ in again.body {}
            #expect(relaunched.dialer.preferredController == b)
        }
    }
}
