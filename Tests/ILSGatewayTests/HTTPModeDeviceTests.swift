import Foundation
import ILSCore
import ILSGateway
import ILSIdentity
import ILSProxy
import ILSStore
import ILSStorePostgres
import ILSTesting
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOSSL
import Testing

/// HTTP mode in front of a `TestBackend` with client certificates from a real controller (`TestCluster`), its
/// policy link up, and enrolled identities as clients: real TLS and sockets on 127.0.0.1.
struct HTTPModeDeviceFixture {
    let cluster: TestCluster
    let backend: TestBackend
    let server: HTTPModeServer
    let port: Int
    let pki: TestPKI

    /// `store` makes the controller's store (PostgreSQL for the tests of several controllers), else SQLite.
    static func with(
        store: (@Sendable () async throws -> any ControllerStore)? = nil,
        configure: (inout HTTPModeConfiguration) -> Void = { _ in },
        _ body: (HTTPModeDeviceFixture) async throws -> Void
    ) async throws {
        let cluster = try await TestCluster.start(gateways: 0, store: store)
        let backend = try await TestBackend.start()
        let pki = try TestPKI()
        let gatewayIdentity = try await cluster.enroll("web", role: .gateway)
        var configuration = HTTPModeConfiguration(
            listen: HostPort(host: "127.0.0.1", port: 0),
            tls: .init(certificateChain: pki.serverCertificatePath, privateKey: pki.serverKeyPath),
            proxy: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: backend.port))
        )
        configuration.devices = .init(identity: gatewayIdentity, service: "claude-api")
        configuration.devices?.identityPath = "\(cluster.directory)/identities/web.json"
        configuration.drainTimeout = .seconds(2)
        configure(&configuration)
        let server = try HTTPModeServer(
            configuration: configuration,
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        let port = try await server.start().port!
        let fixture = HTTPModeDeviceFixture(cluster: cluster, backend: backend, server: server, port: port, pki: pki)
        do {
            guard await TestCluster.eventually(TestTiming.hangGuard, { server.isReady }) else {
                throw ILSError(.unavailable, "the HTTP-mode gateway never got its policy")
            }
            try await body(fixture)
        } catch {
            await fixture.stop()
            throw error
        }
        await fixture.stop()
    }

    func stop() async {
        await server.shutdown()
        await backend.stop()
        await cluster.stop()
        pki.remove()
    }

    /// A TLS connection presenting `identity`'s certificate (or none), trusting the gateway's server certificate.
    /// Makes `name`'s current certificate invalid: `deleted` deletes the identity, `reissued` reissues it and enrolls
    /// the new token, so the old certificate is replaced.
    func invalidate(_ name: String, by change: String) async throws {
        let admin = try cluster.admin()
        if change == "deleted" {
            let _: [String: String] = try await admin.call(.DELETE, "/v1/admin/identities/\(name)")
        } else {
            let token: ControllerAPI.TokenResponse = try await admin.call(
                .POST,
                "/v1/admin/identities/\(name)/reissue",
                body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: 600)
            )
            _ = try await Enrollment.enroll(token: token.token)
        }
    }

    func connect(as identity: IdentityFile?) async throws -> TestHTTPConnection {
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(pki.caCertificatePEM.utf8)))
        tls.applicationProtocols = ["http/1.1"]
        if let identity {
            tls.certificateChain = try NIOSSLCertificate.fromPEMBytes(Array(identity.certificate.utf8))
                .map { .certificate($0) }
            tls.privateKey = .privateKey(try NIOSSLPrivateKey(bytes: Array(identity.privateKey.utf8), format: .pem))
            tls.signingSignatureAlgorithms = [.ed25519]
        }
        let context = try NIOSSLContext(configuration: tls)
        return try await TestHTTPConnection(port: port) { pipeline in
            try pipeline.addHandler(NIOSSLClientHandler(context: context, serverHostname: "localhost"))
        }
    }

    func revoke(_ name: String) async throws {
        let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/\(name)/revoke")
    }
}

@Suite("HTTP mode with client certificates", .clusterExclusive)
struct HTTPModeDeviceTests {
    @Test("an active device gets through and the backend sees its verified identity")
    func activeDevice() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            let connection = try await fixture.connect(as: laptop)
            // A client's own copy of the identity headers is replaced, never passed on.
            try await connection.sendRequest("GET", "/headers", headers: [("X-ILS-Identity", "admin")])
            let head = try await connection.readHead()
            #expect(head.status == 200)
            _ = try await connection.readBody()
            let seen = fixture.backend.record.lastHeaders
            #expect(seen.filter { $0.0.lowercased() == "x-ils-identity" }.map(\.1) == ["laptop"])
            #expect(seen.filter { $0.0.lowercased() == "x-ils-identity-id" }.map(\.1) == [laptop.identity.id])
            await connection.close()
        }
    }

    @Test("a client without a certificate fails the handshake and nothing reaches the backend")
    func noCertificate() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let connection = try? await fixture.connect(as: nil)
            if let connection {
                try? await connection.sendRequest("GET", "/health")
                #expect(await connection.isClosedByPeer())
            }
            #expect(fixture.backend.record.connectionsAccepted == 0)
            #expect(fixture.server.identifiedConnections == 0)
        }
    }

    @Test("a certificate from another CA fails the handshake and nothing reaches the backend")
    func otherCA() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let other = try await TestCluster.start(gateways: 0)
            defer { Task { await other.stop() } }
            let stranger = try await other.enroll("laptop", role: .device)
            let connection = try? await fixture.connect(as: stranger)
            if let connection {
                try? await connection.sendRequest("GET", "/health")
                #expect(await connection.isClosedByPeer())
            }
            #expect(fixture.backend.record.connectionsAccepted == 0)
            await other.stop()
        }
    }

    @Test("an identity that is not a device's is answered 403 dial_denied and nothing reaches the backend")
    func notADevice() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let gateway = try await fixture.cluster.enroll("other-gw", role: .gateway)
            let connection = try await fixture.connect(as: gateway)
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 403)
            #expect(String(buffer: try await connection.readBody()).contains("\"code\":\"dial_denied\""))
            #expect(await connection.isClosedByPeer())
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    /// The controller's answer to the certificate check carries its dial decision, fresher than the grant: a device
    /// that dials straight after it was created may get there before the grant that holds it.
    @Test("a device the grant in force does not hold yet gets in when the controller says it may dial, and joins it")
    func verdictAdmitsBeforeTheGrant() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            #expect(await TestCluster.eventually { fixture.server.admits(certificatePEM: laptop.certificate) })
            // The grant as it was before the device existed.
            #expect(fixture.server.applyGrant([]))
            #expect(!fixture.server.admits(certificatePEM: laptop.certificate))
            let connection = try await fixture.connect(as: laptop)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            _ = try await connection.readBody()
            // Admitted into the grant, so the connection is tracked (a narrowing would end it) and stays open.
            #expect(fixture.server.admits(certificatePEM: laptop.certificate))
            #expect(fixture.server.identifiedConnections == 1)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            await connection.close()
        }
    }

    @Test("an identity a stale grant still holds is refused (dial_denied) when the controller says it may not dial")
    func verdictRefusesAStaleGrant() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let gateway = try await fixture.cluster.enroll("other-gw", role: .gateway)
            // The grant pushed after that creation must land before the stale one is put in force: a device created
            // after it is pushed after it, so once the gateway admits that device, the earlier push has landed.
            let probe = try await fixture.cluster.enroll("probe", role: .device)
            #expect(await TestCluster.eventually { fixture.server.admits(certificatePEM: probe.certificate) })
            // A grant that is behind a narrowing: it still holds an identity the dial policy leaves out.
            #expect(fixture.server.applyGrant([gateway.identity.id]))
            #expect(fixture.server.admits(certificatePEM: gateway.certificate))
            let connection = try await fixture.connect(as: gateway)
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 403)
            #expect(String(buffer: try await connection.readBody()).contains("\"code\":\"dial_denied\""))
            #expect(await connection.isClosedByPeer())
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("revoking a device cuts its live stream and its keep-alive connection, and refuses it afterwards")
    func revokedDevice() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            let phone = try await fixture.cluster.enroll("phone", role: .device)
            let stream = try await fixture.connect(as: laptop)
            try await stream.sendRequest("GET", "/sse?n=100000&interval_ms=50")
            #expect(try await stream.readHead().status == 200)
            #expect(try await stream.readBodyPart() != nil)
            // A keep-alive connection that has finished a request and waits for the next one.
            let idle = try await fixture.connect(as: laptop)
            try await idle.sendRequest("GET", "/health")
            #expect(try await idle.readHead().status == 200)
            _ = try await idle.readBody()
            let other = try await fixture.connect(as: phone)
            try await other.sendRequest("GET", "/sse?n=100000&interval_ms=50")
            #expect(try await other.readHead().status == 200)
            #expect(fixture.server.identifiedConnections == 3)

            try await fixture.revoke("laptop")
            #expect(
                await TestCluster.eventually {
                    fixture.server.blocks(identityID: laptop.identity.id)
                }
            )
            #expect(await stream.bodyEnds(within: TestTiming.scaled(Duration.seconds(5))))
            #expect(await idle.isClosedByPeer())
            // The other device's stream carries on.
            for _ in 0..<3 { #expect(try await other.readBodyPart() != nil) }

            let requestsBefore = fixture.backend.record.connectionsAccepted
            let again = try await fixture.connect(as: laptop)
            try await again.sendRequest("GET", "/health")
            let head = try await again.readHead()
            #expect(head.status == 403)
            #expect(String(buffer: try await again.readBody()).contains("\"code\":\"identity_blocked\""))
            #expect(fixture.backend.record.connectionsAccepted == requestsBefore)
            await other.close()
        }
    }

    /// Neither is in any block list: a deleted identity is gone from the store, and a replaced certificate's identity
    /// is active. Only the controller's store knows, so each connection's certificate is checked with it.
    @Test(
        "a deleted device and a replaced certificate are refused with identity_blocked, and nothing reaches the backend",
        arguments: ["deleted", "reissued"]
    )
    func notCurrent(change: String) async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            let old = try await fixture.cluster.enroll("laptop", role: .device)
            let before = try await fixture.connect(as: old)
            try await before.sendRequest("GET", "/health")
            #expect(try await before.readHead().status == 200)
            await before.close()
            try await fixture.invalidate("laptop", by: change)
            let accepted = fixture.backend.record.connectionsAccepted
            let connection = try await fixture.connect(as: old)
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            #expect(head.status == 403)
            let body = String(buffer: try await connection.readBody())
            #expect(body.contains("\"code\":\"identity_blocked\""))
            #expect(body.contains("no longer valid"))
            #expect(fixture.backend.record.connectionsAccepted == accepted)
        }
    }

    /// Deletion and re-enrollment are not pushed; the certificates of open connections are checked again every
    /// `recheckInterval` (60 s; 200 ms here), so such a connection does not outlive its certificate by more.
    @Test(
        "an open connection of a deleted device or of a replaced certificate is closed at the next recheck",
        arguments: ["deleted", "reissued"]
    )
    func recheckClosesOpenConnections(change: String) async throws {
        try await HTTPModeDeviceFixture.with(configure: { $0.devices?.recheckInterval = .milliseconds(200) }) {
            fixture in
            let old = try await fixture.cluster.enroll("laptop", role: .device)
            let phone = try await fixture.cluster.enroll("phone", role: .device)
            let stream = try await fixture.connect(as: old)
            try await stream.sendRequest("GET", "/sse?n=100000&interval_ms=50")
            #expect(try await stream.readHead().status == 200)
            #expect(try await stream.readBodyPart() != nil)
            let other = try await fixture.connect(as: phone)
            try await other.sendRequest("GET", "/sse?n=100000&interval_ms=50")
            #expect(try await other.readHead().status == 200)
            try await fixture.invalidate("laptop", by: change)
            #expect(await stream.bodyEnds(within: TestTiming.scaled(Duration.seconds(5))))
            for _ in 0..<3 { #expect(try await other.readBodyPart() != nil) }
            await other.close()
        }
    }

    /// A gateway certificate is good for 90 days: without renewal the policy link would fail once it expired and,
    /// after the grace, every client would be refused.
    @Test("the gateway renews its certificate when due and links again with the new one; devices still get in")
    func renewsItsCertificate() async throws {
        // The clock is 80 days ahead (the certificate is due) until the identity file holds another certificate.
        let original = NIOLockedValueBox<(path: String, certificate: String)?>(nil)
        try await HTTPModeDeviceFixture.with(configure: { configuration in
            guard let devices = configuration.devices, let path = devices.identityPath else { return }
            original.withLockedValue { $0 = (path, devices.identity.certificate) }
            configuration.devices?.renewalCheck = .milliseconds(100)
            configuration.devices?.now = {
                let renewed = (try? IdentityFileIO.read(path).certificate) != devices.identity.certificate
                return renewed ? Date() : Date().addingTimeInterval(80 * 86400)
            }
        }) { fixture in
            let (path, certificate) = try #require(original.withLockedValue { $0 })
            #expect(
                await TestCluster.eventually {
                    (try? IdentityFileIO.read(path).certificate) != certificate
                },
                "the identity file was never renewed"
            )
            let renewed = try IdentityFileIO.read(path)
            // The controller now knows only the new certificate; the link is bound with it and the policy holds.
            // Waiting for the controller's record and readiness was not enough (1 run in 5 in a flake hunt got no
            // 200): the controller records the new certificate when it issues it, readiness holds through the
            // policy's grace, and the old link stays bound until it has closed, so a check could go to a link on its
            // way out. The event is the new link bound with the new certificate.
            #expect(
                await TestCluster.eventually {
                    let stored = fixture.cluster.state.identities.identity(named: "web")?.certificateFingerprint
                    return stored == renewed.identity.certificateFingerprint
                        && fixture.server.policyLinkBoundCertificate == renewed.certificate
                }
            )
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            let connection = try await fixture.connect(as: laptop)
            try await connection.sendRequest("GET", "/health")
            let head = try await connection.readHead()
            let body = head.status == 200 ? "" : String(buffer: try await connection.readBody())
            #expect(head.status == 200, "got \(head.status): \(body)")
        }
    }

    /// `ils-gateway renew` run on the gateway's identity file while HTTP mode runs: the controller then knows only the
    /// new certificate and refuses a link made with the old one, so without picking it up the gateway, once its link
    /// dropped (a controller restart), was refused for good and, after the grace, refused every client.
    @Test(
        "a certificate renewed in the identity file by someone else is picked up; after a controller restart devices get in"
    )
    func picksUpACertificateRenewedElsewhere() async throws {
        try await HTTPModeDeviceFixture.with(configure: { $0.devices?.policyGrace = TimeSpan(nanoseconds: 200_000_000) }
        ) { fixture in
            let path = "\(fixture.cluster.directory)/identities/web.json"
            let renewed = try await Renewal.renew(path: path)
            #expect(
                await TestCluster.eventually {
                    fixture.server.policyLinkCertificate == renewed.certificate
                },
                "the policy link still dials with the replaced certificate"
            )
            // Down past the grace (the gateway forgets the policy), then back: the policy now holds only if the link
            // is bound again (with the new certificate).
            await fixture.cluster.controller.shutdown()
            #expect(await TestCluster.eventually { !fixture.server.isReady })
            try await fixture.cluster.restartController()
            #expect(await TestCluster.eventually { fixture.server.isReady })
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            let connection = try await fixture.connect(as: laptop)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
        }
    }

    /// The policy link says `ils-link: policy`; the controller registers it for pushes only (with `.combined` the
    /// relay tried the link, which refused the circuit with 404 `not_hosting`, and the device got 502
    /// `gateway_failed` instead of 503 `service_unavailable`).
    @Test("an overlay device's circuit is never routed to an HTTP-mode gateway's policy link")
    func policyLinkHostsNoCircuits() async throws {
        try await HTTPModeDeviceFixture.with { fixture in
            // The tunnel answers a refused circuit at once and half-closes, and the test client closes on that end
            // of file: the request goes out as the connection comes up (sent later, it raced the answer and failed
            // with "I/O on closed channel" on a loaded machine).
            let connection = try await TestHTTPConnection(
                port: fixture.cluster.tunnelPort,
                firstBytes: "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            )
            let head = try await connection.readHead()
            #expect(head.status == 503)
            #expect(String(buffer: try await connection.readBody()).contains("service_unavailable"))
            #expect(fixture.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("with the controller gone, the last policy holds for the grace, then every request gets 503")
    func controllerGone() async throws {
        // The grace must outlast one request after the shutdown even under ASan with the suite in parallel (2 s did
        // not, once): 4 s, scaled like every deadline a test sets on purpose.
        let grace = TestTiming.scaled(TimeSpan.seconds(4))
        try await HTTPModeDeviceFixture.with(configure: { $0.devices?.policyGrace = grace }) { fixture in
            let laptop = try await fixture.cluster.enroll("laptop", role: .device)
            // The controller pushes the new device's grant after the enrollment returns: the policy to hold is the
            // one with it (once, under ASan, the controller went first and the device got 403 dial_denied).
            #expect(
                await TestCluster.eventually {
                    fixture.server.admits(certificatePEM: laptop.certificate)
                }
            )
            await fixture.cluster.controller.shutdown()
            // Asked while the gateway has not yet seen its link close, the controller's certificate check goes
            // unanswered and the device gets 503 after `PolicyLink.checkTimeout` (a linked controller that does not
            // answer keeps the door shut). The grace is about what follows once the link is known to be down.
            #expect(await TestCluster.eventually { !fixture.server.policyLinkIsBound })
            let during = try await fixture.connect(as: laptop)
            try await during.sendRequest("GET", "/health")
            let duringHead = try await during.readHead()
            let duringBody = String(buffer: try await during.readBody())
            #expect(duringHead.status == 200, "\(duringHead.status): \(duringBody)")
            #expect(await TestCluster.eventually { !fixture.server.isReady })
            let after = try await fixture.connect(as: laptop)
            try await after.sendRequest("GET", "/health")
            #expect(try await after.readHead().status == 503)
            #expect(String(buffer: try await after.readBody()).contains("\"code\":\"policy_unavailable\""))
            // The link comes back with the controller, and so does the service.
            try await fixture.cluster.restartController()
            #expect(await TestCluster.eventually { fixture.server.isReady })
            let back = try await fixture.connect(as: laptop)
            try await back.sendRequest("GET", "/health")
            #expect(try await back.readHead().status == 200)
        }
    }

    /// Issue 37, item 2, in HTTP mode: the gateway's policy link goes to the identity file's controller (A), which
    /// answers each connection's certificate check from its own directory. With A's store feed stalled, A keeps
    /// answering "may dial" after a narrowing made through B; the policy link to B (learned from A's controller list)
    /// carries B's narrowed grant, and the gateway admits only what every controller's grant holds.
    @Test(
        "with the first controller's feed stalled, a narrowing through the second keeps the device out of an HTTP-mode gateway linked to the first"
    )
    func narrowingThroughAnotherControllerFailsClosed() async throws {
        let server = try TestPostgres.shared()
        let url = try server.createDatabase()
        let database = TestPostgres.databaseName(url)
        try await HTTPModeDeviceFixture.with(store: {
            // A's feed is never replaced during the test (its probe would notice the stall after ten minutes).
            try await PostgresControllerStore(
                url: url,
                logger: Logger(label: "store", factory: { _ in SwiftLogNoOpLogHandler() }),
                feedProbe: ChangeFeedProbe(interval: .seconds(600), bound: .seconds(10))
            )
        }) { fixture in
            let cluster = fixture.cluster
            let listenersOfA = try server.listeningProcesses(database: database)
            try #require(listenersOfA.count == 1, "A listens on one connection: \(listenersOfA)")
            let b = try await cluster.startReplica(
                store: try await PostgresControllerStore(
                    url: url,
                    logger: Logger(label: "store", factory: { _ in SwiftLogNoOpLogHandler() })
                )
            )
            // The gateway's file names A only: it learns B from A's controller list and links to it too.
            #expect(
                await TestCluster.eventually {
                    fixture.server.policyLinkControllers.contains(b.description) && fixture.server.policyLinksBound
                }
            )
            let tablet = try await cluster.enroll("tablet", role: .device, attributes: ["team"])
            let admin = try cluster.admin()
            let current: ControllerAPI.ServiceInfo = try await admin.call(.GET, "/v1/admin/services/claude-api")
            let _: ControllerAPI.ServiceInfo = try await admin.call(
                .PUT,
                "/v1/admin/services/claude-api",
                body: ControllerAPI.ServiceRequest(
                    dial: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["#team"]),
                    revision: current.revision
                )
            )
            #expect(await cluster.replicaHeard(identity: "tablet", attributes: ["team"], dial: "anyOf(#team)"))
            try server.signal(SIGSTOP, process: listenersOfA[0])
            defer { try? server.signal(SIGCONT, process: listenersOfA[0]) }

            let probes = NumberedProbes { number in
                do {
                    let connection = try await fixture.connect(as: tablet)
                    defer { Task { await connection.close() } }
                    try await connection.sendRequest("GET", "/health?probe=tablet-\(number)")
                    return try await connection.readHead().status == 200
                } catch {
                    return false
                }
            }
            let probing = Task { await probes.run() }
            #expect(await TestCluster.eventually { probes.admitted > 0 }, "the device never got in before the change")
            let _: IdentityRecord = try await cluster.admin(through: b).call(
                .PUT,
                "/v1/admin/identities/tablet/attributes",
                body: ControllerAPI.AttributesRequest(attributes: [])
            )
            let fence = probes.fence()
            #expect(await TestCluster.eventually { probes.finished(after: fence) >= 20 })
            probing.cancel()
            _ = await probing.value
            let late = probes.admittedNumbers.filter { $0 >= fence }
            #expect(late.isEmpty, "probes \(late), sent after the narrowing returned, were admitted")
            let reached = fixture.backend.record.targets.compactMap { target -> Int? in
                guard target.hasPrefix("/health?probe=tablet-") else { return nil }
                return Int(target.dropFirst("/health?probe=tablet-".count))
            }
            #expect(!reached.contains { $0 >= fence }, "the backend saw probes from #\(fence) on")
            // A never heard of the narrowing: its own answer still says the tablet may dial.
            #expect(cluster.state.identities.identity(named: "tablet")?.attributes == ["team"])
        }
    }
}
