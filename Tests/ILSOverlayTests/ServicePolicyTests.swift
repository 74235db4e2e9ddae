import Foundation
import ILSClient
import ILSCore
import ILSFabric
import ILSGateway
import ILSProxy
import ILSTesting
import NIOCore
import Testing

@Suite("Services and policies, enforced by the controller and by the gateway itself", .clusterExclusive)
struct ServicePolicyTests {
    private func openStream(_ port: Int) async throws -> TestHTTPConnection {
        let connection = try await TestHTTPConnection(port: port)
        try await connection.sendRequest("GET", "/sse?n=100000&interval_ms=50")
        #expect(try await connection.readHead().status == 200)
        _ = try await connection.readBodyPart()
        return connection
    }

    /// The refusal code of a dial by `identity`, or nil when the circuit opened.
    private func dialRefusal(_ identity: IdentityFile, service: String = "claude-api") async throws -> String? {
        let dialer = try OverlayDialer(identity: identity)
        do {
            let circuit = try await dialer.dial(service: service).get()
            try? await circuit.close()
            return nil
        } catch let OverlayDialer.DialError.refused(code, _) {
            return code
        }
    }

    /// The audit log through the API, which first writes the rows queued from event loops (refusals, cuts).
    private func audit(_ cluster: TestCluster) async throws -> [ControllerAPI.AuditEntry] {
        let page: ControllerAPI.AuditPage = try await cluster.admin().call(.GET, "/v1/admin/audit")
        return page.entries
    }

    private func update(
        _ cluster: TestCluster,
        _ service: String,
        dial: [String]? = nil,
        bind: [String]? = nil
    ) async throws -> ControllerAPI.ServiceInfo {
        let admin = try cluster.admin()
        let current: ControllerAPI.ServiceInfo = try await admin.call(.GET, "/v1/admin/services/\(service)")
        return try await admin.call(
            .PUT,
            "/v1/admin/services/\(service)",
            body: ControllerAPI.ServiceRequest(
                dial: dial.map { ControllerAPI.PolicyText(semantic: .anyOf, tokens: $0) },
                bind: bind.map { ControllerAPI.PolicyText(semantic: .anyOf, tokens: $0) },
                revision: current.revision
            )
        )
    }

    @Test("a device without the attribute is refused by the controller (403 dial_denied); one with it gets through")
    func attributeDecidesAtTheController() async throws {
        try await withCluster { cluster in
            let tablet = try await cluster.enroll("tablet", role: .device, attributes: ["ipad"])
            let plain = try await cluster.enroll("plain", role: .device)
            let info = try await update(cluster, "claude-api", dial: ["#ipad"])
            #expect(info.dial == ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["#ipad"]))
            #expect(info.revision == 2)

            let accepted = cluster.backend.record.connectionsAccepted
            #expect(try await dialRefusal(plain) == "dial_denied")
            #expect(cluster.backend.record.connectionsAccepted == accepted, "the backend heard a refused device")
            #expect(try await dialRefusal(tablet) == nil)

            let audit = try await audit(cluster)
            #expect(audit.contains { $0.action == "service.update" && $0.target == "claude-api" })
            #expect(audit.contains { $0.action == "dial.refused" && $0.actor == "plain" })
        }
    }

    @Test("a forged circuit that skips the controller is refused by the gateway; a narrowed grant ends an open one")
    func gatewayEnforcesOnItsOwn() async throws {
        try await withCluster { cluster in
            let tablet = try await cluster.enroll("tablet", role: .device, attributes: ["ipad"])
            let plain = try await cluster.enroll("plain", role: .device)
            var gatewayFile = try await cluster.enroll("gw-rogue", role: .gateway)
            let rogue = try await RogueController.start(state: cluster.state)
            gatewayFile.controller = rogue.address.description
            gatewayFile.controllers = [rogue.address.description]
            let backend = try await TestBackend.start()
            let gateway = try OverlayGateway(
                identity: gatewayFile,
                service: "claude-api",
                proxy: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: backend.port)),
                logger: cluster.logger
            )
            let running = Task { try await gateway.run() }
            defer {
                gateway.stop()
                running.cancel()
                Task { await backend.stop() }
            }
            #expect(await TestCluster.eventually { rogue.hostedService == "claude-api" })
            let grant = DialGrant(service: "claude-api", policy: "anyOf(#ipad)", identities: [tablet.identity.id])
            try await rogue.send(HostControlMessage(dialRoles: [.device], blocked: [], dialGrant: grant))
            #expect(await TestCluster.eventually { gateway.isHosting })

            // The device has the right role, a valid certificate and a real handshake: only the grant keeps it out.
            let (refused, _) = try await rogue.forgeCircuit(service: "claude-api", device: plain)
            guard case .refused(let reason) = refused else {
                Issue.record("the gateway let a device outside its grant in: \(refused)")
                return
            }
            #expect(reason.contains("may not dial"), "\(reason)")
            #expect(backend.record.connectionsAccepted == 0)

            let (established, circuit) = try await rogue.forgeCircuit(service: "claude-api", device: tablet)
            #expect(established == .established)
            // A pushed grant without the tablet (and without dialRoles: not a new binding) ends its open circuit.
            try await rogue.send(
                HostControlMessage(dialGrant: DialGrant(service: "claude-api", policy: "anyOf()", identities: []))
            )
            let open = try #require(circuit)
            #expect(await TestCluster.eventually { !open.isActive })
            await rogue.stop()
        }
    }

    @Test("taking a device's permission away ends its live stream before the change returns; others stream on")
    func narrowingCutsLiveStreams() async throws {
        try await withCluster { cluster in
            let tablet = try await cluster.enroll("tablet", role: .device, attributes: ["ipad"])
            let tabletPort = try await cluster.startTunnel(identity: tablet)
            let ipad = try await openStream(cluster.tunnelPort)
            let kept = try await openStream(tabletPort)

            _ = try await update(cluster, "claude-api", dial: ["#ipad"])
            // Ordering, not timing: the cut happened before the answer, so the stream's end is already on its way.
            #expect(await ipad.bodyEnds(within: TestTiming.scaled(Duration.seconds(10))))
            for _ in 0..<3 { #expect(try await kept.readBodyPart() != nil) }
            let sessions: [ControllerAPI.Session] = try await cluster.admin().call(.GET, "/v1/admin/sessions")
            #expect(sessions.map(\.device) == ["tablet"])

            // Removing the attribute does the same.
            let _: IdentityRecord = try await cluster.admin().call(
                .PUT,
                "/v1/admin/identities/tablet/attributes",
                body: ControllerAPI.AttributesRequest(attributes: [])
            )
            #expect(await kept.bodyEnds(within: TestTiming.scaled(Duration.seconds(10))))
            #expect(try await dialRefusal(tablet) == "dial_denied")

            let audit = try await audit(cluster)
            #expect(audit.filter { $0.action == "circuit.cut" }.map(\.target).sorted() == ["ipad", "tablet"])
            #expect(audit.contains { $0.action == "identity.attributes" && $0.detail == "[] (was [ipad])" })
        }
    }

    @Test("two services reach two backends; a gateway the bind policy leaves out is refused")
    func twoServicesTwoBackends() async throws {
        try await withCluster { cluster in
            let admin = try cluster.admin()
            let created: ControllerAPI.ServiceInfo = try await admin.call(
                .POST,
                "/v1/admin/services",
                body: ControllerAPI.ServiceRequest(
                    name: "second-api",
                    dial: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["role:device"]),
                    bind: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["#second"])
                )
            )
            #expect(created.revision == 1)
            // A gateway without the attribute may not host it: the controller refuses the binding.
            let (wrong, _) = try await cluster.startGateway(
                identity: try await cluster.enroll("gw-wrong", role: .gateway),
                service: "second-api"
            )
            #expect(
                await TestCluster.eventually {
                    CapturedLog.lines(containing: "cluster=\(cluster.id) ").contains { $0.contains("may not host") }
                }
            )
            #expect(!wrong.isHosting)
            let audit = try await audit(cluster)
            #expect(
                audit.contains { $0.action == "bind.refused" && $0.actor == "gw-wrong" && $0.target == "second-api" }
            )

            let second = try await cluster.addGateway(name: "gw-second", service: "second-api", attributes: ["second"])
            let phone = try await cluster.enroll("phone", role: .device)
            let firstPort = try await cluster.startTunnel(identity: phone)
            let secondPort = try await cluster.startTunnel(identity: phone, service: "second-api")

            let (firstBefore, secondBefore) = (
                cluster.backend.record.connectionsAccepted, second.record.connectionsAccepted
            )
            for port in [firstPort, secondPort] {
                let connection = try await TestHTTPConnection(port: port)
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
                await connection.close()
            }
            #expect(cluster.backend.record.connectionsAccepted == firstBefore + 1)
            #expect(second.record.connectionsAccepted == secondBefore + 1)

            let services: [ControllerAPI.ServiceInfo] = try await admin.call(.GET, "/v1/admin/services")
            #expect(services.map(\.name) == ["claude-api", "second-api"])
            #expect(services.allSatisfy { !$0.hosts.isEmpty })

            // Deleting the service ends its circuits and its gateway's links.
            let stream = try await openStream(secondPort)
            let _: [String: String] = try await admin.call(.DELETE, "/v1/admin/services/second-api")
            #expect(await stream.bodyEnds(within: TestTiming.scaled(Duration.seconds(10))))
            #expect(try await dialRefusal(phone, service: "second-api") == "unknown_service")
        }
    }

}
