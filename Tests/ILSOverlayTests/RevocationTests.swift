import Foundation
import ILSClient
import ILSCore
import ILSTesting
import NIOCore
import Testing

@Suite("Revocation and day-2 administration", .clusterExclusive)
struct RevocationTests {
    /// Opens a long SSE stream through `port` and reads its first event.
    func openStream(_ port: Int) async throws -> TestHTTPConnection {
        let connection = try await TestHTTPConnection(port: port)
        try await connection.sendRequest("GET", "/sse?n=100000&interval_ms=50")
        #expect(try await connection.readHead().status == 200)
        _ = try await connection.readBodyPart()
        return connection
    }

    @Test("revoking a device ends its live stream at once, refuses it after, and leaves another device alone")
    func revokeDevice() async throws {
        try await withCluster { cluster in
            let laptopPort = try await cluster.startTunnel(identity: try await cluster.enroll("laptop", role: .device))
            let ipad = try await openStream(cluster.tunnelPort)
            let laptop = try await openStream(laptopPort)

            let sessions: [ControllerAPI.Session] = try await cluster.admin().call(.GET, "/v1/admin/sessions")
            #expect(Set(sessions.map(\.device)) == ["ipad", "laptop"])
            #expect(sessions.allSatisfy { $0.bytesToDevice > 0 && $0.bytesFromDevice > 0 })

            let clock = ContinuousClock()
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/ipad/revoke")
            let returned = clock.now
            #expect(await ipad.bodyEnds(within: TestTiming.scaled(Duration.seconds(5))))
            print("revocation: ipad's stream ended \(clock.now - returned) after the command returned")

            // The laptop's stream carries on, and its new requests work.
            for _ in 0..<3 { #expect(try await laptop.readBodyPart() != nil) }
            let again = try await TestHTTPConnection(port: laptopPort)
            try await again.sendRequest("GET", "/health")
            #expect(try await again.readHead().status == 200)
            // The ipad's new requests are refused: its connection is closed without an answer.
            let refused = try await TestHTTPConnection(port: cluster.tunnelPort)
            try? await refused.sendRequest("GET", "/health")
            #expect(await refused.isClosedByPeer())

            let audit = try await cluster.state.store.auditEntries(since: 0)
            #expect(audit.contains { $0.action == "identity.revoke" && $0.target == "ipad" && $0.actor == "admin" })
            await laptop.close()
            await again.close()
        }
    }

    @Test("disable ends the live stream; enable lets the device back in")
    func disableEnable() async throws {
        try await withCluster { cluster in
            let stream = try await openStream(cluster.tunnelPort)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/ipad/disable")
            #expect(await stream.bodyEnds(within: TestTiming.scaled(Duration.seconds(5))))
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/ipad/enable")
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            await connection.close()
        }
    }

    @Test("a revoked device that dials again is told why: 403 identity_blocked naming the revocation, then closed")
    func revokedDeviceIsToldWhy() async throws {
        try await withCluster { cluster in
            let phone = try await cluster.enroll("phone", role: .device)
            let dialer = try OverlayDialer(identity: phone)
            let circuit = try await dialer.dial(service: "claude-api").get()
            circuit.close(promise: nil)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/phone/revoke")
            var refusal: (code: String, reason: String)?
            // The revocation closed the phone's connection; a dial that still finds it going away fails (`closed`, or
            // I/O on a closed channel). The next dial makes a new connection and is refused on it, with the reason.
            for _ in 0..<100 where refusal == nil || refusal?.code == "closed" {
                do {
                    (try await dialer.dial(service: "claude-api").get()).close(promise: nil)
                } catch OverlayDialer.DialError.refused(let code, let reason) {
                    refusal = (code, reason)
                } catch {
                    // The old connection going away (`I/O on closed channel`): dial again.
                }
                try await Task.sleep(for: .milliseconds(20))
            }
            #expect(refusal?.code == "identity_blocked")
            #expect(refusal?.reason.contains("'phone' is revoked") == true)
            #expect(cluster.controller.splices.sameLoop + cluster.controller.splices.crossLoop == 1)
        }
    }

    @Test("a revoked identity stays revoked: it cannot be enabled or reissued")
    func revokedIsFinal() async throws {
        try await withCluster { cluster in
            let admin = try cluster.admin()
            let _: IdentityRecord = try await admin.call(.POST, "/v1/admin/identities/ipad/revoke")
            for path in [
                "/v1/admin/identities/ipad/enable", "/v1/admin/identities/ipad/disable",
                "/v1/admin/identities/ipad/revoke",
            ] {
                do {
                    let _: IdentityRecord = try await admin.call(.POST, path)
                    Issue.record("\(path) succeeded on a revoked identity")
                } catch {
                    #expect((error as? ILSError)?.code == .conflict)
                }
            }
            do {
                let _: ControllerAPI.TokenResponse = try await admin.call(
                    .POST,
                    "/v1/admin/identities/ipad/reissue",
                    body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: 60)
                )
                Issue.record("a revoked identity was reissued")
            } catch {
                #expect((error as? ILSError)?.code == .conflict)
            }
        }
    }

    @Test("revoking a gateway closes its hosting connection and keeps it out")
    func revokeGateway() async throws {
        try await withCluster { cluster in
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/gw1/revoke")
            #expect(
                await TestCluster.eventually { !cluster.gateways[0].isHosting }
            )
            // It dials again and is refused, and told why: still out after that.
            #expect(
                await TestCluster.eventually {
                    cluster.capturedLog.contains { $0.contains("the controller refused this gateway's identity") }
                }
            )
            #expect(!cluster.gateways[0].isHosting)
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try? await connection.sendRequest("GET", "/health")
            #expect(await connection.isClosedByPeer())
        }
    }

    @Test("deleting a device ends its circuits and its open connection cannot open new ones")
    func deleteDevice() async throws {
        try await withCluster { cluster in
            let stream = try await openStream(cluster.tunnelPort)
            let _: [String: String] = try await cluster.admin().call(.DELETE, "/v1/admin/identities/ipad")
            #expect(await stream.bodyEnds(within: TestTiming.scaled(Duration.seconds(5))))
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try? await connection.sendRequest("GET", "/health")
            #expect(await connection.isClosedByPeer())
        }
    }

    @Test("a gateway that was offline during a revocation learns it on reconnecting and refuses the device itself")
    func offlineGatewayLearnsRevocation() async throws {
        try await withCluster { cluster in
            let ipad = try #require(try await cluster.state.store.identity(named: "ipad"))
            #expect(!cluster.gateways[0].blocks(identityID: ipad.id))
            // The controller goes away; the revocation is written while no gateway is connected.
            await cluster.controller.shutdown()
            #expect(await TestCluster.eventually { !cluster.gateways[0].isHosting })
            _ = try await cluster.state.store.changeState(named: "ipad", to: .revoked, actor: "admin")
            try await cluster.restartController()
            #expect(
                await TestCluster.eventually { cluster.gateways[0].isHosting }
            )
            #expect(cluster.gateways[0].blocks(identityID: ipad.id))
        }
    }
}
