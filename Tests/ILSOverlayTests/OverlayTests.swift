import Crypto
import Foundation
import ILSCore
import ILSFabric
import ILSGateway
import ILSProxy
import ILSTesting
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing

/// Runs `body` with a fresh in-process cluster and always stops it. When `body` throws, what the cluster's roles
/// logged at notice and above is printed (a failure under CI load is rare and cannot be rerun with logging on).
func withCluster(
    gateways: Int = 1,
    configureProxy: @escaping @Sendable (inout ProxyConfiguration) -> Void = { _ in },
    _ body: (TestCluster) async throws -> Void
) async throws {
    let cluster = try await TestCluster.start(gateways: gateways, configureProxy: configureProxy)
    do {
        try await body(cluster)
    } catch {
        await cluster.stop()
        printLog(of: cluster)
        throw error
    }
    await cluster.stop()
}

private func printLog(of cluster: TestCluster) {
    let lines = cluster.capturedLog
    print("cluster \(cluster.id) logged \(lines.count) lines at notice and above:")
    for line in lines { print("  \(line)") }
}

@Suite("The overlay: tunnel → controller relay → dark gateway → backend", .clusterExclusive)
struct OverlayTests {
    @Test("SSE arrives event by event through the overlay, and the backend sees the device's identity")
    func sseThroughOverlay() async throws {
        try await withCluster { cluster in
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await connection.sendRequest("GET", "/sse?n=20&interval_ms=\(TestTiming.scaled(milliseconds: 100))")
            #expect(try await connection.readHead().status == 200)
            let first = try #require(try await connection.readBodyPart())
            #expect(String(buffer: first).contains("\"index\": 0"))
            #expect(cluster.backend.record.eventsSent < 20)
            _ = try await connection.drainBody()
            try await connection.sendRequest("GET", "/headers", headers: [("X-ILS-Identity", "mallory")])
            #expect(try await connection.readHead().status == 200)
            let lines = String(buffer: try await connection.readBody()).split(separator: "\n").map(String.init)
            #expect(lines.contains("x-ils-identity: ipad"))
            #expect(!lines.contains("x-ils-identity: mallory"))
            await connection.close()
        }
    }

    @Test("a WebSocket upgrade passes through the overlay")
    func webSocketThroughOverlay() async throws {
        try await withCluster { cluster in
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await connection.sendRequest(
                "GET",
                "/ws",
                headers: [("Connection", "Upgrade"), ("Upgrade", "websocket")]
            )
            #expect(try await connection.readHead().status == 101)
            try await connection.send("ping\n")
            var received = ""
            while !received.contains("ping\n") { received += String(buffer: try await connection.readRaw()) }
            #expect(received.hasPrefix("hello\n"))
            await connection.close()
        }
    }

    @Test("100 concurrent circuits carry their payloads intact", .clusterAlone)
    func concurrentCircuits() async throws {
        try await withCluster { cluster in
            let size = 200 * 1024
            let expected = SHA256.hash(data: TestBackend.pattern(size: size))
            let port = cluster.tunnelPort
            let results = try await withThrowingTaskGroup(of: Bool.self) { group in
                for _ in 0..<100 {
                    group.addTask {
                        let connection = try await TestHTTPConnection(port: port)
                        try await connection.sendRequest("GET", "/bytes?size=\(size)")
                        guard try await connection.readHead().status == 200 else { return false }
                        let body = try await connection.readBody()
                        await connection.close()
                        return SHA256.hash(data: Array(body.readableBytesView)) == expected
                    }
                }
                return try await group.reduce(into: [Bool]()) { $0.append($1) }
            }
            #expect(results.count == 100)
            #expect(results.allSatisfy { $0 })
        }
    }

    /// swift-nio-http2's defaults end a connection after 200 stream resets in 30 s; a circuit's normal abortive end
    /// is a reset, so a busy device (or the gateway behind it) must survive many hang-ups in a row. With the defaults,
    /// the circuit in flight when the 200th reset tears the connection down fails.
    @Test("300 clients hanging up mid-stream in a row leave every circuit and the overlay working", .clusterAlone)
    func manyHangUps() async throws {
        try await withCluster { cluster in
            for index in 0..<300 {
                let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
                try await connection.sendRequest("GET", "/sse?n=1000&interval_ms=1000")
                let head = try await connection.readHead()
                #expect(head.status == 200, "hang-up \(index)")
                #expect(try await connection.readBodyPart() != nil, "hang-up \(index)")
                await connection.close()
            }
            let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await connection.sendRequest("GET", "/health")
            #expect(try await connection.readHead().status == 200)
            await connection.close()
        }
    }

    /// A gateway whose `run` task is cancelled stops, as on a graceful shutdown. Its connect loops used to go on: a
    /// cancelled task's sleeps return at once, so a gateway whose controller was gone redialled it about a thousand
    /// times a second for as long as the process lived (one such gateway, left by a test, starved a whole suite run).
    @Test("cancelling a gateway's run stops its connect loops, even while its controller is unreachable")
    func cancelledRunStops() async throws {
        try await withCluster { cluster in
            var file = try await cluster.enroll("gw-gone", role: .gateway)
            let gone = "https://127.0.0.1:\(try TestCluster.freePort())"
            file.controller = gone
            file.controllers = [gone]
            let gateway = try OverlayGateway(
                identity: file,
                service: "claude-api",
                proxy: ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: 9)),
                logger: cluster.logger
            )
            let returned = NIOLockedValueBox(false)
            let running = Task {
                try? await gateway.run()
                returned.withLockedValue { $0 = true }
            }
            #expect(await TestCluster.eventually { !gateway.diallingControllers.isEmpty })
            running.cancel()
            // The run returns only once every connect loop has ended.
            #expect(await TestCluster.eventually { returned.withLockedValue { $0 } })
            #expect(gateway.diallingControllers.isEmpty)
            gateway.stop()
        }
    }

    /// The gateway keeps every backend connection on its one event loop: the whole `--backend-max-connections` is
    /// that loop's, not a share of it per core.
    @Test("an overlay gateway holds as many concurrent backend requests as --backend-max-connections allows")
    func backendLimitIsTheGateways() async throws {
        try await withCluster(configureProxy: { $0.backendMaxConnections = 4 }) { cluster in
            var streams: [TestHTTPConnection] = []
            for _ in 0..<4 {
                let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
                try await connection.sendRequest("GET", "/sse?n=1000&interval_ms=1000")
                streams.append(connection)
            }
            // Every stream is answered while all four are open (with the limit split per core, the later ones would
            // wait for a connection to come free, and get 503 after the pool wait).
            for connection in streams {
                #expect(try await connection.readHead().status == 200)
                #expect(try await connection.readBodyPart() != nil)
            }
            #expect(cluster.backend.record.connectionsAccepted == 4)
            for connection in streams { await connection.close() }
        }
    }

    @Test("a gateway identity used in a tunnel is refused by policy, at once, and the backend hears nothing")
    func gatewayIdentityCannotDial() async throws {
        try await withCluster { cluster in
            let rogue = try await cluster.enroll("rogue-gw", role: .gateway)
            let port = try await cluster.startTunnel(identity: rogue)
            let connection = try await TestHTTPConnection(port: port)
            do {
                try await connection.sendRequest("GET", "/health")
            } catch ChannelError.ioOnClosedChannel {
                // The tunnel refused and closed before the request was written: refused at once, as it should be.
            }
            #expect(await connection.isClosedByPeer())
            #expect(cluster.backend.record.connectionsAccepted == 0)
        }
    }

    @Test("a device that stops reading one stream does not slow another circuit, nor grow without bound")
    func slowReaderIsolated() async throws {
        try await withCluster { cluster in
            let stalled = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await stalled.sendRequest("GET", "/bytes?size=\(256 * 1024 * 1024)")
            #expect(try await stalled.readHead().status == 200)
            _ = try await stalled.readBodyPart()
            // The stalled circuit sits at its flow-control windows; another circuit runs to completion meanwhile.
            let other = try await TestHTTPConnection(port: cluster.tunnelPort)
            try await other.sendRequest("GET", "/sse?n=3&interval_ms=50")
            #expect(try await other.readHead().status == 200)
            #expect(String(buffer: try await other.readBody()).contains("\"index\": 2"))
            // The gateway holds its read of the stalled circuit's backend connection: nothing more comes off it.
            #expect(await TestCluster.eventually { cluster.gateways[0].heldBackendReads == 1 })
            #expect(cluster.backend.record.bytesWritten < 48 * 1024 * 1024)
            await stalled.close()
            await other.close()
        }
    }

    @Test("after a controller restart, new requests through the same tunnel succeed within seconds")
    func controllerRestart() async throws {
        try await withCluster { cluster in
            try await cluster.restartController()
            var succeeded = false
            let clock = ContinuousClock()
            let deadline = clock.now + .seconds(15)
            while clock.now < deadline, !succeeded {
                if let connection = try? await TestHTTPConnection(port: cluster.tunnelPort) {
                    try? await connection.sendRequest("GET", "/health")
                    if let head = try? await connection.readHead(), head.status == 200 { succeeded = true }
                    await connection.close()
                }
                if !succeeded { try await Task.sleep(for: .milliseconds(100)) }
            }
            #expect(succeeded)
        }
    }

    @Test(
        "a gateway keeps a link on each of the relay's event loops, and no circuit's bytes cross threads in the relay",
        .enabled(if: System.coreCount > 1, "one event loop: every splice shares it")
    )
    func oneLinkPerRelayLoop() async throws {
        try await withCluster { cluster in
            let loops = RelayLoops(MultiThreadedEventLoopGroup.singleton).count
            #expect(
                await TestCluster.eventually {
                    cluster.gateways[0].relayLoopsCovered == loops
                }
            )
            // Device connections land on the controller's loops in turn: four tunnels cover both of two loops.
            var ports = [cluster.tunnelPort]
            for index in 2...4 {
                ports.append(
                    try await cluster.startTunnel(identity: try await cluster.enroll("tablet\(index)", role: .device))
                )
            }
            for port in ports {
                for _ in 0..<2 {
                    let connection = try await TestHTTPConnection(port: port)
                    try await connection.sendRequest("GET", "/health")
                    #expect(try await connection.readHead().status == 200)
                    _ = try await connection.readBody()
                    await connection.close()
                }
            }
            let splices = cluster.controller.splices
            #expect(splices.sameLoop == 8)
            #expect(splices.crossLoop == 0)
        }
    }

    @Test("two gateways share the dials; when one goes away, the other takes them all")
    func twoGateways() async throws {
        try await withCluster(gateways: 2) { cluster in
            // The relay prefers the gateway links on the device connection's loop: until each gateway has a link on
            // every loop (its later links come up after the first), one of them may have none on the device's.
            let loops = RelayLoops(MultiThreadedEventLoopGroup.singleton).count
            #expect(
                await TestCluster.eventually {
                    cluster.gateways.allSatisfy { $0.relayLoopsCovered == loops }
                }
            )
            for _ in 0..<6 {
                let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
                await connection.close()
            }
            #expect(cluster.backends[0].record.connectionsAccepted > 0)
            #expect(cluster.backends[1].record.connectionsAccepted > 0)
            cluster.gateways[0].stop()
            // The relay's view, not the gateway's: `stop()` marks its links stopped before it returns, while the
            // controller may still route a circuit to them until it has seen them close.
            #expect(
                await TestCluster.eventually {
                    !(cluster.controller.hosting["claude-api"] ?? []).contains { $0.gateway == "gw1" }
                }
            )
            let before = cluster.backends[0].record.connectionsAccepted
            for _ in 0..<4 {
                let connection = try await TestHTTPConnection(port: cluster.tunnelPort)
                try await connection.sendRequest("GET", "/health")
                #expect(try await connection.readHead().status == 200)
                _ = try await connection.readBody()
                await connection.close()
            }
            #expect(cluster.backends[0].record.connectionsAccepted == before)
        }
    }
}
