import Crypto
import Foundation
import ILSClient
import ILSCore
import ILSCrypto
import ILSFabric
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
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

    @Test(
        "a 16 MiB upload survives its device's connection dropping midway: the backend hashes every byte once",
        .clusterAlone
    )
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

    /// A device that offers the resumable suite but never resumes (grace 0): what a device that vanished looks like
    /// to the gateway. (A device of this release with grace 0 does not offer suite 5 at all: `deviceWithoutGrace`.)
    static func vanishingDevice(_ identity: IdentityFile) throws -> OverlayDialer {
        try OverlayDialer(
            identity: identity,
            eventLoop: MultiThreadedEventLoopGroup.singleton.next(),
            keepalive: .standard,
            handshakeVersion: E2EHandshake.version,
            retention: CircuitRetention(grace: .zero),
            suites: E2EHandshake.version.suites
        )
    }

    /// A gateway's retention with `grace` and a budget of its own (what it keeps is then this test's alone).
    static func gateway(grace: TimeAmount) -> CircuitRetention {
        CircuitRetention(grace: grace, budget: RetentionBudget(limit: CircuitRetention.defaultTotal))
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

    /// Grace 0 is the behaviour before resumption, at no cost: the device does not offer suite 5, so nothing is kept
    /// or acknowledged, and the gateway (whose own window is long here) does not hold its circuits either.
    @Test("a device with grace 0 offers suite 4: the gateway holds nothing, and a lost path ends the backend request")
    func deviceWithoutGrace() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(600))) { cluster, backend in
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            let dialer = try OverlayDialer(identity: identity, retention: CircuitRetention(grace: .zero))
            let failure = await Self.streamUntilDropped(
                OverlayClient(dialer: dialer),
                cluster: cluster,
                identity: identity
            )
            #expect(failure?.userInfo[OverlayURLError.reasonKey] as? String == "truncated")
            // Held, the backend request would go on for the gateway's 600 s.
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            #expect(gateway.resumableCircuits.held == 0)
            #expect(gateway.expiredCount == 0)
            #expect(gateway.retainedBytes == 0)
        }
    }

    @Test(
        "a gateway that no longer holds the circuit refuses its resumption: the app's stream ends with not_resumed, not truncated"
    )
    func notHeldIsNotResumed() async throws {
        // A window of 1 ms: the gateway agrees the resumable suite, holds the circuit and lets it go before any
        // resumption can arrive (it needs a new TLS connection).
        try await Self.withGateway(retention: Self.gateway(grace: .milliseconds(1))) { cluster, backend in
            let identity = try await cluster.enroll("tab", role: .device)
            let failure = await Self.streamUntilDropped(
                try OverlayClient(identity: identity),
                cluster: cluster,
                identity: identity
            )
            #expect(failure?.userInfo[OverlayURLError.reasonKey] as? String == "not_resumed")
            #expect(failure?.code == .networkConnectionLost)
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            #expect(cluster.gateways[0].resumedCount == 0)
        }
    }

    @Test("a gateway with grace 0 agrees suite 4: a lost path ends the request as truncated, and nothing is held")
    func gatewayWithoutGrace() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .zero)) { cluster, backend in
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            let failure = await Self.streamUntilDropped(
                try OverlayClient(identity: identity),
                cluster: cluster,
                identity: identity
            )
            #expect(failure?.userInfo[OverlayURLError.reasonKey] as? String == "truncated")
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            #expect(gateway.resumableCircuits.held == 0)
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(gateway.expiredCount == 0 && gateway.resumedCount == 0)
        }
    }

    @Test(
        "after the grace window the gateway cancels the backend request and keeps nothing: no circuit, no retained byte"
    )
    func graceRunsOut() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .milliseconds(300))) { cluster, backend in
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            // A device that agrees the resumable suite and never resumes (one that vanished): the gateway holds its
            // circuit alone, then gives it up.
            let dialer = try Self.vanishingDevice(identity)
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

    /// A resumption naming a gateway that will never hold the circuit was refused `gateway_unavailable`, like one
    /// naming a gateway that is only redialling, and the device tried it again for its whole grace window (issue 49:
    /// 60 s). The relay tells them apart now: `no_such_gateway` is final.
    @Test(
        "the relay refuses for good a resumption naming a gateway that will never hold the circuit; one that may come back is tried again"
    )
    func resumptionNamingNoSuchGateway() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(60))) { cluster, _ in
            _ = try await cluster.admin().call(
                ControllerRoutes.createService,
                body: ControllerAPI.ServiceRequest(
                    name: "second-api",
                    dial: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["role:device"]),
                    bind: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["#second"])
                )
            )
            try await cluster.addGateway(name: "gw-second", service: "second-api", attributes: ["second"])
            let second = try #require(cluster.state.identities.identity(named: "gw-second"))
            let hosting = try #require(cluster.state.identities.identity(named: "gw1"))
            // An active gateway that may host the service and has no link now: it may come back.
            let away = try await cluster.enroll("gw-away", role: .gateway)
            let phone = try await cluster.enroll("tab", role: .device)
            let dialer = try OverlayDialer(identity: phone)
            func refusal(naming gateway: String) async -> String? {
                do {
                    let stream = try await dialer.openResumptionStream(service: "claude-api", gateway: gateway).get()
                    try? await stream.close()
                    return nil
                } catch {
                    return (error as? CircuitRefused)?.code ?? "\(error)"
                }
            }
            #expect(await refusal(naming: UUID().uuidString.lowercased()) == "no_such_gateway")
            #expect(await refusal(naming: phone.identity.id) == "no_such_gateway", "a device is no gateway")
            #expect(await refusal(naming: second.id) == "no_such_gateway", "another service's gateway")
            #expect(await refusal(naming: away.identity.id) == "gateway_unavailable")
            #expect(await refusal(naming: hosting.id) == nil, "the hosting gateway's stream opens")
        }
    }

    /// A device whose grace window is ten times the hang guard: one that took its circuit's end for a lost path and
    /// tried to resume it until its window ran out fails a test at the hang guard, not after its window.
    static func patientDevice(_ identity: IdentityFile) throws -> OverlayClient {
        OverlayClient(dialer: try patientDialer(identity))
    }

    /// The dialer of `patientDevice`, for tests that count its resumptions.
    static func patientDialer(_ identity: IdentityFile) throws -> OverlayDialer {
        let window = TimeAmount.nanoseconds(ClusterDeadlines.resumeGrace.nanoseconds * 10)
        return try OverlayDialer(identity: identity, retention: CircuitRetention(grace: window))
    }

    /// Takes `tab`'s access away as `action` says: `revoke` or `disable` the identity, or `narrow` the service's
    /// dial policy to leave it out.
    static func takeAccess(_ action: String, in cluster: TestCluster) async throws {
        let admin = try cluster.admin()
        guard action == "narrow" else {
            let _: IdentityRecord = try await admin.call(.POST, "/v1/admin/identities/tab/\(action)")
            return
        }
        let current: ControllerAPI.ServiceInfo = try await admin.call(.GET, "/v1/admin/services/claude-api")
        let _: ControllerAPI.ServiceInfo = try await admin.call(
            .PUT,
            "/v1/admin/services/claude-api",
            body: ControllerAPI.ServiceRequest(
                dial: ControllerAPI.PolicyText(semantic: .anyOf, tokens: ["#someone-else"]),
                revision: current.revision
            )
        )
    }

    /// Streams SSE through `client`, does `act` once three events have arrived, and returns how the stream ended:
    /// the overlay's reason (`not_resumed`, `truncated`), "ended", or nil if it had not ended at the hang guard. Prints
    /// how long after `act` it ended.
    static func streamUntilEnd(_ client: OverlayClient, after act: @escaping @Sendable () async throws -> Void)
        async -> String?
    {
        let outcome = NIOLockedValueBox<String?>(nil)
        let actedAt = NIOLockedValueBox<ContinuousClock.Instant?>(nil)
        let streaming = Task {
            let reason: String
            do {
                let response = try await client.stream(
                    URLRequest(url: URL(string: "http://claude-api/sse?n=100000&interval_ms=10")!)
                )
                var received = ""
                for try await chunk in response.body {
                    received += String(decoding: chunk, as: UTF8.self)
                    if actedAt.withLockedValue({ $0 }) == nil, sseData(received).count >= 3 {
                        actedAt.withLockedValue { $0 = .now }
                        try await act()
                    }
                }
                reason = "ended"
            } catch let error as URLError {
                reason = error.userInfo[OverlayURLError.reasonKey] as? String ?? "\(error)"
            } catch {
                reason = "\(error)"
            }
            outcome.withLockedValue { $0 = reason }
            if let actedAt = actedAt.withLockedValue({ $0 }) {
                print("\(reason) \(ContinuousClock.now - actedAt) after")
            }
        }
        if !(await TestCluster.eventually { outcome.withLockedValue { $0 } != nil }) { streaming.cancel() }
        return outcome.withLockedValue { $0 }
    }

    /// The device's side: a circuit whose gateway was revoked while it streamed ends at once with `not_resumed`.
    @Test(
        "a device whose gateway is revoked mid-stream gets not_resumed at its first resumption, not at its window's end"
    )
    func revokedGatewayEndsTheResumptionAtOnce() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(60))) { cluster, _ in
            let dialer = try Self.patientDialer(try await cluster.enroll("tab", role: .device))
            let reason = await Self.streamUntilEnd(OverlayClient(dialer: dialer)) {
                let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/gw1/revoke")
            }
            #expect(reason == "not_resumed")
            // Refused once (`no_such_gateway`: a revoked gateway never comes back), not tried again.
            #expect(dialer.resumptionAttempts == 1)
        }
    }

    /// What held circuits kept is freed in the middle of the heap, where the allocator keeps it (issue 49: 448 MB of
    /// RSS stayed after 400 held circuits expired): the gateway hands it back (`malloc_trim` in the executable) once
    /// circuits have closed (`MemoryRelease`, whose own tests show it does not while none closes).
    @Test("the gateway hands freed memory back once circuits close")
    func memoryIsReleasedAfterCircuitsClose() async throws {
        let released = NIOLockedValueBox(0)
        let cluster = try await TestCluster.start(gateways: 0)
        do {
            try await cluster.addGateway(name: "gw1", releaseMemory: { released.withLockedValue { $0 += 1 } })
            let gateway = cluster.gateways[0]
            let dialer = try OverlayDialer(identity: try await cluster.enroll("tab", role: .device))
            let circuit = try await dialer.dial(service: "claude-api").get()
            try await circuit.writeAndFlush(
                ByteBuffer(string: "GET /sse?n=100000&interval_ms=100 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            )
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 1 })
            try await circuit.close()
            #expect(await TestCluster.eventually { released.withLockedValue { $0 } >= 1 })
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }

    /// Revocation, disable and narrowing while attached (issue 49): the controller says why it ends the device's
    /// circuit (a GOAWAY on the connection of a blocked identity, `BlockedNotice`; a reset of its own code on the
    /// stream of a circuit the dial policy no longer allows, `FabricProtocol.dialDeniedReset`), and the device ends it
    /// with that reason at once, without a resumption that the relay would refuse anyway. Before, it held the
    /// circuit, asked to resume, and reported `not_resumed`.
    @Test(
        "a device revoked, disabled or narrowed out mid-stream gets the reason and asks for no resumption",
        arguments: [("revoke", "identity_blocked"), ("disable", "identity_blocked"), ("narrow", "dial_denied")]
    )
    func blockedDeviceEndsWithoutResuming(action: String, expected: String) async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(60))) { cluster, backend in
            let dialer = try Self.patientDialer(try await cluster.enroll("tab", role: .device))
            let reason = await Self.streamUntilEnd(OverlayClient(dialer: dialer)) {
                try await Self.takeAccess(action, in: cluster)
            }
            #expect(reason == expected)
            #expect(dialer.resumptionAttempts == 0)
            #expect(cluster.gateways[0].resumedCount == 0)
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            if expected == "identity_blocked" {
                let offline = if case .offline(code: "identity_blocked", _) = dialer.linkState { true } else { false }
                #expect(offline, "link state: \(dialer.linkState)")
            }
        }
    }

    /// What a circuit's own pipeline sees when the controller ends it: the reason once, and no `truncated` after it
    /// (the app's reader stops at the first error; a handler on the circuit itself sees them all).
    @Test(
        "a circuit ended by the controller reports its reason once, and no truncation after it",
        arguments: ["revoke", "narrow"]
    )
    func controllerEndIsReportedOnce(action: String) async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(60))) { cluster, _ in
            let dialer = try OverlayDialer(identity: try await cluster.enroll("tab", role: .device))
            let circuit = try await dialer.dial(service: "claude-api").get()
            let errors = ErrorCollector()
            let seen = ByteCollector()
            try await circuit.eventLoop.submit {
                try circuit.pipeline.syncOperations.addHandler(seen)
                try circuit.pipeline.syncOperations.addHandler(errors)
            }.get()
            try await circuit.writeAndFlush(
                ByteBuffer(string: "GET /sse?n=100000&interval_ms=20 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            )
            #expect(await TestCluster.eventually { sseData(seen.text).count >= 3 })
            try await Self.takeAccess(action, in: cluster)
            try await circuit.closeFuture.get()
            #expect(errors.codes == [action == "revoke" ? "identity_blocked" : "dial_denied"])
        }
    }

    /// A gateway that stopped closed its links first: its devices took that for a lost path and resumed against a
    /// gateway that was going (`not_resumed` 2.24 s later if it came back, nothing until their window's end if not:
    /// issue 49). It ends its circuits first now, with CANCEL.
    @Test("a gateway that stops tells its devices: their answers end truncated at once, and none resumes")
    func stoppingGatewayTellsItsDevices() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(600))) { cluster, backend in
            let gateway = cluster.gateways[0]
            let client = try Self.patientDevice(try await cluster.enroll("tab", role: .device))
            let reason = await Self.streamUntilEnd(client) { gateway.stop() }
            #expect(reason == "truncated")
            #expect(gateway.resumedCount == 0)
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
        }
    }

    /// One device that loses its path with many circuits open could make a gateway hold them all for a grace window
    /// (its circuit cap, 256 a controller, counts open streams only: issue 49). The gateway holds at most
    /// `heldPerIdentity` of one device; the rest end with their paths, their backend requests with them.
    @Test("a device past the gateway's held-circuit cap has the rest ended with their paths; another device's are held")
    func heldCircuitCapPerIdentity() async throws {
        let retention = CircuitRetention(
            grace: .seconds(600),
            budget: RetentionBudget(limit: CircuitRetention.defaultTotal, heldPerIdentity: 2)
        )
        try await Self.withGateway(retention: retention) { cluster, backend in
            let gateway = cluster.gateways[0]
            let many = try await cluster.enroll("many", role: .device)
            let other = try await cluster.enroll("other", role: .device)
            let request = ByteBuffer(string: "GET /sse?n=100000&interval_ms=50 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            for (identity, circuits) in [(many, 3), (other, 1)] {
                let dialer = try Self.vanishingDevice(identity)
                for _ in 0..<circuits {
                    try await dialer.dial(service: "claude-api").get().writeAndFlush(request)
                }
            }
            #expect(await TestCluster.eventually { backend.record.targets.filter { $0.hasPrefix("/sse") }.count == 4 })
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 4 })
            cluster.controller.dropConnections(identityID: many.identity.id)
            cluster.controller.dropConnections(identityID: other.identity.id)
            #expect(await TestCluster.eventually { gateway.notHeld(.identity) == 1 })
            #expect(await TestCluster.eventually { gateway.resumableCircuits.held == 3 })
            #expect(gateway.resumableCircuits.registered == 3, "the circuit past the cap is gone")
            #expect(gateway.notHeld(.total) == 0)
            // Its backend request ended with it; the held ones go on.
            #expect(await TestCluster.eventually { backend.record.streamsDisconnected == 1 })
        }
    }

    /// Opens `count` circuits of a new device "mute" to `/bytes` answers far larger than any bound, whose app reads
    /// nothing: records wait below it, and a device acknowledges only what it handed up, so each circuit stays at its
    /// bound at the gateway.
    static func muteCircuits(_ count: Int, in cluster: TestCluster) async throws -> [any Channel] {
        let dialer = try OverlayDialer(identity: try await cluster.enroll("mute", role: .device))
        let request = ByteBuffer(string: "GET /bytes?size=\(64 * 1024 * 1024) HTTP/1.1\r\nHost: claude-api\r\n\r\n")
        var opened: [any Channel] = []
        for _ in 0..<count {
            let circuit = try await dialer.dial(service: "claude-api").get()
            try await circuit.setOption(ChannelOptions.autoRead, value: false).get()
            try await circuit.writeAndFlush(request)
            opened.append(circuit)
        }
        return opened
    }

    /// Issue 49's must-show: 80 attached circuits of a device that stays connected but acknowledges nothing. The
    /// gateway's proxy core watches a circuit's writability as any client's: one not writable for
    /// `--client-stall-timeout` (60 s by default in overlay mode, 2 s here) is cut, with CANCEL, its backend request
    /// ends (issue 49 measured 75 s and called it for ever), and the cut is counted
    /// (`ils_gateway_circuits_stalled_total`). `deploy/bench/run.sh --only stall` shows the same at the default.
    @Test(
        "80 circuits whose device acknowledges nothing are cut at the stall timeout, with their backend requests, each counted once"
    )
    func unacknowledgedCircuitsAreCut() async throws {
        let circuits = 80
        let stalls = NIOLockedValueBox(0)
        let cluster = try await TestCluster.start(
            gateways: 0,
            configureProxy: {
                $0.clientStallTimeout = TestTiming.scaled(TimeSpan.seconds(2))
                $0.clientStalled = { stalls.withLockedValue { $0 += 1 } }
            }
        )
        do {
            let backend = try await cluster.addGateway(name: "gw1", retention: Self.gateway(grace: .seconds(600)))
            let gateway = cluster.gateways[0]
            let opened = try await Self.muteCircuits(circuits, in: cluster)
            #expect(await TestCluster.eventually { backend.record.connectionsAccepted == circuits })
            #expect(await TestCluster.eventually { backend.record.connectionsClosed == circuits })
            #expect(await TestCluster.eventually { stalls.withLockedValue { $0 } == circuits })
            for circuit in opened { #expect(await TestCluster.eventually { !circuit.isActive }) }
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(await TestCluster.eventually { gateway.retainedBytes == 0 })
            // Cut, not lost: no circuit was held, and none resumed.
            #expect(gateway.resumedCount == 0)
            #expect(gateway.resumableCircuits.held == 0)
            #expect(stalls.withLockedValue { $0 } == circuits)
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }

    /// Issue 49: attached circuits' bytes counted against the total that held circuits share, so one device could
    /// starve everyone's held circuits. Here one device's 80 circuits sit at their bounds (their device acknowledges
    /// nothing, and the stall timeout, 600 s, never comes during the test), keeping far more than the gateway's whole
    /// `--resume-total` of 8 MiB; another device's circuit loses its path meanwhile, is held, and resumes whole.
    @Test(
        "one device's 80 stalled circuits, keeping more than the whole total, leave another device's circuit held and resumed"
    )
    func stalledCircuitsLeaveHeldOnesTheTotal() async throws {
        let circuits = 80
        let total = 8 * 1024 * 1024
        try await Self.withGateway(
            retention: CircuitRetention(grace: .seconds(600), budget: RetentionBudget(limit: total))
        ) { cluster, backend in
            let gateway = cluster.gateways[0]
            let opened = try await Self.muteCircuits(circuits, in: cluster)
            // Every circuit at its floor at least: together six times the total.
            let stalledFloor = circuits * CircuitRetention.minimumPerCircuit
            #expect(await TestCluster.eventually { gateway.retainedBytes >= stalledFloor })

            let other = try await cluster.enroll("tab", role: .device)
            let response = try await OverlayClient(identity: other).stream(
                URLRequest(url: URL(string: "http://claude-api/sse?n=40&interval_ms=20")!)
            )
            var received = ""
            var dropped = false
            for try await chunk in response.body {
                received += String(decoding: chunk, as: UTF8.self)
                if !dropped, sseData(received).count >= 5 {
                    dropped = true
                    cluster.controller.dropConnections(identityID: other.identity.id)
                }
            }
            #expect(sseData(received) == Self.events(40))
            #expect(gateway.resumedCount == 1)
            #expect(gateway.notHeld(.total) == 0)
            // The stalled circuits were there all along, at their bounds.
            #expect(gateway.retainedBytes >= stalledFloor)
            #expect(opened.allSatisfy { $0.isActive })
            #expect(backend.record.streamsDisconnected == 0)
            for circuit in opened { circuit.close(promise: nil) }
            #expect(await TestCluster.eventually { backend.record.connectionsClosed >= circuits })
        }
    }

    /// A plain close between a request and its answer's head was a clean end (FINAL), and a held circuit that ended
    /// cleanly waited for its device for the whole grace window: at stop 46's CI, 71 circuits whose backends had not
    /// answered yet kept 22,720 bytes long after their gateway stopped. The gateway's stop cuts them now, and a close
    /// before the answer's head is a cut too (`CircuitCloseHandler`).
    @Test("a gateway that stops ends at once a held circuit whose backend has not answered yet, and keeps nothing")
    func stopEndsAHeldCircuitAwaitingItsAnswer() async throws {
        try await Self.withGateway(retention: Self.gateway(grace: .seconds(600))) { cluster, backend in
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            let circuit = try await Self.vanishingDevice(identity).dial(service: "claude-api").get()
            try await circuit.writeAndFlush(
                ByteBuffer(string: "GET /slow-headers HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            )
            #expect(await TestCluster.eventually { backend.record.targets.contains("/slow-headers") })
            cluster.controller.dropConnections(identityID: identity.identity.id)
            #expect(await TestCluster.eventually { gateway.resumableCircuits.held == 1 })
            gateway.stop()
            // Bounded by the hang guard, 60 s, far below the 600 s window it would otherwise be held for.
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(gateway.retainedBytes == 0)
            #expect(
                await TestCluster.eventually { backend.record.connectionsClosed == backend.record.connectionsAccepted }
            )
        }
    }

    @Test(
        "refused resumptions change nothing: a replay after success, another identity's replay, an unknown circuit; the stream goes on; a revocation ends the circuit"
    )
    func refusals() async throws {
        try await withClientCluster { cluster in
            let identity = try await cluster.enroll("tab", role: .device)
            let other = try await cluster.enroll("other", role: .device)
            let gateway = cluster.gateways[0]
            let dialer = try OverlayDialer(identity: identity)
            let circuit = try #require(try await dialer.dial(service: "claude-api").get() as? CircuitChannel)
            let seen = ByteCollector()
            try await circuit.eventLoop.submit { try circuit.pipeline.syncOperations.addHandler(seen) }.get()
            try await circuit.writeAndFlush(
                ByteBuffer(string: "GET /sse?n=150&interval_ms=20 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            )
            #expect(await TestCluster.eventually { sseData(seen.text).count >= 3 })
            let (secrets, gatewayID) = try await circuit.eventLoop.submit {
                (try #require(circuit.secrets), try #require(circuit.peerID))
            }.get()

            // The device's own resumption (attempt 1) after its connection dropped.
            cluster.controller.dropConnections(identityID: identity.identity.id)
            #expect(await TestCluster.eventually { gateway.resumedCount == 1 })

            func resume(_ attempt: UInt32, id: [UInt8], secrets: E2EResumeSecrets, via: OverlayDialer) async throws
                -> [[UInt8]]
            {
                let message = E2EResumeMessage(kind: .request, circuitID: id, attempt: attempt, received: 0)
                    .sealed(with: secrets)
                return try await Self.frames(answering: message, via: via, gateway: gatewayID)
            }
            // The same RESUME again: a replay.
            let replayed = try await resume(1, id: secrets.circuitID, secrets: secrets, via: dialer)
            #expect(replayed.map { E2EHandshake.refusalReason($0) } == ["the resumption was replayed"])
            // A fresh attempt, made with the circuit's key (as if captured), sent by another identity.
            let stolen = try await resume(
                7,
                id: secrets.circuitID,
                secrets: secrets,
                via: try OverlayDialer(identity: other)
            )
            #expect(stolen.map { E2EHandshake.refusalReason($0) } == ["the circuit belongs to another identity"])
            // A circuit the gateway does not hold.
            let unknown = E2EResumeSecrets(
                keys: E2EDirectionKeys(
                    initiatorToResponder: [UInt8](repeating: 1, count: 32),
                    responderToInitiator: [UInt8](repeating: 2, count: 32)
                )
            )
            let none = try await resume(1, id: unknown.circuitID, secrets: unknown, via: dialer)
            #expect(none.map { E2EHandshake.refusalReason($0) } == ["this gateway holds no such circuit"])
            // None of them moved the circuit: one resumption, and the answer goes on to its end, each event once.
            #expect(gateway.resumedCount == 1)
            #expect(await TestCluster.eventually { seen.text.hasSuffix("0\r\n\r\n") })
            #expect(sseData(seen.text) == Self.events(150))
            #expect(cluster.backend.record.streamsCompleted == 1)

            // The answered circuit ends (HTTP/1.1 keeps it open otherwise), so that the count below is the next one's:
            // waiting for "1 registered" with this one still there passed at once whenever the gateway had not yet
            // registered the next circuit, and failed for good when it had (a busy machine).
            try await circuit.close()
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })

            // A revocation ends a circuit at once, held or not, and a resumption after it is refused by the relay.
            let live = try #require(try await dialer.dial(service: "claude-api").get() as? CircuitChannel)
            try await live.writeAndFlush(
                ByteBuffer(string: "GET /sse?n=100000&interval_ms=20 HTTP/1.1\r\nHost: claude-api\r\n\r\n")
            )
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 1 })
            let liveID = try await live.eventLoop.submit { try #require(live.secrets) }.get()
            cluster.controller.dropConnections(identityID: identity.identity.id)
            let _: IdentityRecord = try await cluster.admin().call(.POST, "/v1/admin/identities/tab/revoke")
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(await TestCluster.eventually { cluster.backend.record.streamsDisconnected == 1 })
            await #expect(throws: (any Error).self) {
                _ = try await resume(9, id: liveID.circuitID, secrets: liveID, via: dialer)
            }
            try await live.closeFuture.get()
        }
    }

    /// Sends `message` as the first frame of a resumption stream to `gateway` through `dialer`, and returns every
    /// frame the gateway answered with until the stream closed.
    static func frames(answering message: [UInt8], via dialer: OverlayDialer, gateway: String) async throws
        -> [[UInt8]]
    {
        let stream = try await dialer.openResumptionStream(service: "claude-api", gateway: gateway).get()
        let frames = FrameCollector()
        try await stream.eventLoop.submit {
            try stream.pipeline.syncOperations.addHandler(frames)
            var framed = ByteBuffer()
            framed.writeInteger(UInt32(message.count))
            framed.writeBytes(message)
            stream.writeAndFlush(framed, promise: nil)
        }.get()
        try await stream.closeFuture.get()
        return frames.all
    }
}

/// Everything a circuit's pipeline reads, as text.
final class ByteCollector: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    private let bytes = NIOLockedValueBox("")

    var text: String { bytes.withLockedValue { $0 } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        bytes.withLockedValue { $0 += String(buffer: buffer) }
    }
}

/// The codes of the circuit errors a circuit's pipeline reports, in order (other errors by their description).
final class ErrorCollector: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    private let seen = NIOLockedValueBox<[String]>([])

    var codes: [String] { seen.withLockedValue { $0 } }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        seen.withLockedValue { $0.append((error as? E2ECircuitError)?.code ?? "\(error)") }
    }
}

/// The frames a stream's frame decoder hands up.
final class FrameCollector: ChannelInboundHandler, Sendable {
    typealias InboundIn = ByteBuffer
    private let frames = NIOLockedValueBox<[[UInt8]]>([])

    var all: [[UInt8]] { frames.withLockedValue { $0 } }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let buffer = unwrapInboundIn(data)
        frames.withLockedValue { $0.append(Array(buffer.readableBytesView)) }
    }
}

@Suite("Held circuits are bounded in memory", .clusterAlone)
struct HeldCircuitMemoryTests {
    @Test(
        "held circuits whose backends keep writing keep no more than the configured total: the rest waits in the backends (200; ILS_HELD_CIRCUITS=1000 for the issue's figure)"
    )
    func heldCircuitsStayWithinTheTotal() async throws {
        // 200 (50 where the code runs slower: a sanitizer sets ILS_TEST_TIME_SCALE); ILS_HELD_CIRCUITS for more.
        let count =
            Int(ProcessInfo.processInfo.environment["ILS_HELD_CIRCUITS"] ?? "") ?? (TestTiming.scale > 1 ? 50 : 200)
        // 8 MiB for what they keep beyond what each held circuit reserves for a read (`RetentionBudget.writeReserve`,
        // within the total: a circuit that does not fit with it is not held).
        let limit = 8 * 1024 * 1024 + count * RetentionBudget.writeReserve
        let cluster = try await TestCluster.start(
            gateways: 0,
            circuitLimits: .init(concurrent: 2 * count, opensPerSecond: 10 * count)
        )
        do {
            let backend = try await cluster.addGateway(
                name: "gw1",
                retention: CircuitRetention(
                    grace: .seconds(600),
                    budget: RetentionBudget(limit: limit, heldPerIdentity: count)
                )
            )
            let gateway = cluster.gateways[0]
            let identity = try await cluster.enroll("tab", role: .device)
            // A device that never comes back: its circuits end with their paths; the gateway holds its halves.
            let dialer = try ResumptionTests.vanishingDevice(identity)
            // Each backend answers more than a circuit may keep (1 MiB), as fast as its socket takes it, but only once
            // every circuit is held (`&held`): what the circuits keep is then what they read while held, and once
            // they all stop the machine is idle, however slow it is. (Endless SSE at 10,000 events a second kept a
            // sanitizer's 2 cores busy for minutes; other tests' deadlines ran out beside it.)
            let request = ByteBuffer(
                string: "GET /bytes?size=\(4 * 1024 * 1024)&chunked&held HTTP/1.1\r\nHost: claude-api\r\n\r\n"
            )
            try await withThrowingTaskGroup(of: Void.self) { group in
                for batch in 0..<(count / 50) {
                    for _ in 0..<50 {
                        group.addTask {
                            let circuit = try await dialer.dial(service: "claude-api").get()
                            try await circuit.writeAndFlush(request)
                        }
                    }
                    if batch % 4 == 3 { try await group.waitForAll() }
                }
                try await group.waitForAll()
            }
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == count })
            cluster.controller.dropConnections(identityID: identity.identity.id)
            #expect(await TestCluster.eventually { gateway.resumableCircuits.held == count })
            // What the circuits kept while attached (their response heads, bounded per circuit, not by the total).
            let atHold = gateway.retainedBytes
            backend.held.release()
            // Every held circuit stops reading its backend once the total is reached.
            #expect(await TestCluster.eventually { gateway.heldBackendReads == count })
            let retained = gateway.retainedBytes
            let held = gateway.heldRetainedBytes
            print(
                "\(count) held circuits keep \(retained) bytes, \(held) with their reservations (total bound \(limit); \(atHold) when held)"
            )
            // A hard bound: what they keep, with each one's reservation of a read, never exceeds the total. (It was
            // soft: a circuit learned that the total was reached at its next write, and what its backend read in
            // progress brought was kept, up to one read per circuit beyond the total.)
            #expect(held <= limit, "\(held) bytes held")
            #expect(retained <= limit, "\(retained) bytes kept")
            // And they stopped at it, not long before: what is not kept is reservations, at most one read each for
            // the circuits that may still read, and each of those has one.
            #expect(held >= limit - RetentionBudget.writeReserve, "the circuits stopped before the total: \(held)")
            gateway.stop()
            #expect(await TestCluster.eventually { gateway.resumableCircuits.registered == 0 })
            #expect(gateway.retainedBytes == 0)
        } catch {
            await cluster.stop()
            throw error
        }
        await cluster.stop()
    }
}
