import Foundation
public import ILSController
public import ILSCore
import ILSCrypto
public import ILSFabric
public import ILSGateway
public import ILSIdentity
public import ILSProxy
public import ILSStore
public import ILSTunnel
public import Logging
import NIOPosix

/// The whole system in one process on 127.0.0.1: a controller (real TLS, real SQLite file), gateways serving
/// `TestBackend`s in overlay mode, and a device tunnel — each enrolled through the real enrollment path. Like
/// tailscale's `testcontrol` and ziti's in-process tests, other tests build on it.
public final class TestCluster: @unchecked Sendable {
    public let directory: String
    public let controllerPort: Int
    public private(set) var controller: ControllerServer
    public let state: ControllerState
    public private(set) var gateways: [OverlayGateway] = []
    public private(set) var backends: [TestBackend] = []
    public private(set) var tunnel: Tunnel?
    /// Tunnels started after the first (`startTunnel`), shut down by `stop` as the first is.
    private var moreTunnels: [Tunnel] = []
    /// The stores `restartController` opened and those given to `startReplica`, closed by `stop`.
    private var restartedStores: [any ControllerStore] = []
    public private(set) var tunnelPort = 0
    /// Controller replicas started with `startReplica`, sharing the first controller's store object.
    public private(set) var replicas: [(server: ControllerServer, state: ControllerState)] = []
    private var tasks: [Task<Void, any Error>] = []
    private var configureProxy: @Sendable (inout ProxyConfiguration) -> Void = { _ in }
    /// This cluster's name in its log lines (`cluster=<id>`).
    public let id: String
    /// Every role of this cluster logs here: to standard error at the level `ILS_TEST_LOG` names (`debug`, `info`,
    /// ...), otherwise into `CapturedLog` at notice and above, which `withCluster` prints when a test fails.
    public let logger: Logger

    static func makeLogger(id: String) -> Logger {
        var logger: Logger
        if let raw = ProcessInfo.processInfo.environment["ILS_TEST_LOG"], let level = Logger.Level(rawValue: raw) {
            logger = Logger(label: "cluster", factory: { StreamLogHandler.standardError(label: $0) })
            logger.logLevel = level
        } else {
            logger = Logger(label: "cluster", factory: { CapturedLog.Handler(label: $0) })
        }
        logger[metadataKey: "cluster"] = "\(id)"
        return logger
    }

    /// What this cluster's roles logged at notice and above (nothing when `ILS_TEST_LOG` sends it to stderr).
    public var capturedLog: [String] { CapturedLog.lines(containing: "cluster=\(id) ") }

    public var backend: TestBackend { backends[0] }

    private init(
        id: String,
        logger: Logger,
        directory: String,
        port: Int,
        state: ControllerState,
        controller: ControllerServer
    ) {
        self.id = id
        self.logger = logger
        self.directory = directory
        self.controllerPort = port
        self.state = state
        self.controller = controller
    }

    /// Starts a controller, `gateways` gateways (each with its own backend) and a tunnel for a device `ipad`.
    /// `configureProxy` adjusts each gateway's proxy settings (limits, timeouts) before it starts.
    /// `store`, when given, makes the controller's store (a fresh PostgreSQL database in the cluster tests; a retry
    /// on another port needs an empty one again); else a SQLite file. `stop` closes the store.
    /// `circuitLimits` are the controller's per-identity caps (`CircuitLimiter`).
    public static func start(
        gateways: Int = 1,
        store: (@Sendable () async throws -> any ControllerStore)? = nil,
        circuitLimits: CircuitLimiter.Limits = .standard,
        configureProxy: @escaping @Sendable (inout ProxyConfiguration) -> Void = { _ in }
    ) async throws -> TestCluster {
        let cluster = try await startController(store: store, circuitLimits: circuitLimits)
        cluster.configureProxy = configureProxy
        for index in 0..<gateways { try await cluster.addGateway(name: "gw\(index + 1)") }
        try await cluster.startTunnel(identity: try await cluster.enroll("ipad", role: .device))
        return cluster
    }

    /// A controller on a free port. The port is picked before the state is made (its address goes into the state),
    /// so another socket can take it in between; then this starts over on another port, a few times.
    private static func startController(
        attempts: Int = 5,
        store makeStore: (@Sendable () async throws -> any ControllerStore)?,
        circuitLimits: CircuitLimiter.Limits
    ) async throws -> TestCluster {
        for attempt in 1...attempts {
            let store = try await makeStore?()
            let id = String(UUID().uuidString.prefix(8)).lowercased()
            let logger = makeLogger(id: id)
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ils-cluster-\(UUID())").path
            let port = try freePort()
            let state = try await ControllerState.initialize(
                directory: "\(directory)/controller",
                address: try ControllerAddress(parsing: "https://127.0.0.1:\(port)"),
                adminOut: "\(directory)/identities/admin.json",
                store: store
            )
            // Test clusters start in a moment: a controller alone announces itself at once, not after 30 s.
            state.roster.announceAloneAfter(.zero)
            let server = try ControllerServer(
                state: state,
                listen: HostPort(host: "127.0.0.1", port: port),
                logger: logger,
                handshakeTimeout: ClusterDeadlines.tlsHandshake,
                circuitOpenTimeout: ClusterDeadlines.circuitOpen,
                keepalive: ClusterDeadlines.keepalive,
                circuitLimits: circuitLimits,
                rosterInterval: Self.rosterInterval
            )
            do {
                _ = try await server.start()
                return TestCluster(
                    id: id,
                    logger: logger,
                    directory: directory,
                    port: port,
                    state: state,
                    controller: server
                )
            } catch {
                await state.store.close()
                guard attempt < attempts, error.reason.contains("Address already in use") else { throw error }
            }
            try? FileManager.default.removeItem(atPath: directory)
        }
        preconditionFailure("the last attempt returns or throws")
    }

    /// The admin API, as the admin identity `init` wrote, waiting on answers as on events (`patient`).
    public func admin() throws -> ControllerClient {
        try ControllerClient(identityFile: try IdentityFileIO.read("\(directory)/identities/admin.json")).patient
    }

    /// The admin client speaking to `controller` only (a replica): the admin file pointed at it, with no list.
    public func admin(through controller: ControllerAddress) throws -> ControllerClient {
        var file = try IdentityFileIO.read("\(directory)/identities/admin.json")
        file.controller = controller.description
        file.controllers = []
        return try ControllerClient(identityFile: file).patient
    }

    /// Waits until replica `index`'s directory holds `attributes` for `identity` and `dial` as the dial policy of
    /// `service`: it heard what was written through another controller. Returns whether it did.
    public func replicaHeard(
        _ index: Int = 0,
        identity: String,
        attributes: [String],
        service: String = "claude-api",
        dial: String
    ) async -> Bool {
        let state = replicas[index].state
        return await Self.eventually {
            state.identities.identity(named: identity)?.attributes == attributes
                && state.identities.service(named: service)?.dial.description == dial
        }
    }

    /// Creates and enrolls an identity through the admin API and the real enrollment client.
    public func enroll(_ name: String, role: IdentityRole, attributes: [String] = []) async throws -> IdentityFile {
        let admin = try admin()
        let created = try await admin.call(
            ControllerRoutes.createIdentity,
            body: ControllerAPI.CreateIdentityRequest(
                name: name,
                role: role,
                attributes: attributes,
                tokenLifetimeSeconds: 600
            )
        )
        return try await Enrollment.enroll(
            token: created.token,
            outputPath: "\(directory)/identities/\(name).json",
            force: false,
            answerTimeout: ControllerClient.patientTimeout
        ).file
    }

    /// Adds a gateway of `service` with a fresh backend, and waits until the controller lets it host. Returns the
    /// backend.
    @discardableResult
    public func addGateway(
        name: String,
        service: String = "claude-api",
        attributes: [String] = [],
        retention: CircuitRetention? = nil,
        releaseMemory: (@Sendable () -> Void)? = nil
    ) async throws -> TestBackend {
        let (gateway, backend) = try await startGateway(
            identity: try await enroll(name, role: .gateway, attributes: attributes),
            service: service,
            retention: retention,
            releaseMemory: releaseMemory
        )
        guard await Self.eventually(TestTiming.hangGuard, { gateway.isHosting }) else {
            throw ILSError(.unavailable, "gateway never hosted")
        }
        return backend
    }

    /// Starts a gateway of `service` with `identity` and a fresh backend, without waiting for it to host (a test of
    /// a refused binding); `stop` ends both.
    /// `retention` defaults to the standard grace and bounds with a budget of the gateway's own, so its
    /// `retainedBytes` is its circuits' alone.
    public func startGateway(
        identity: IdentityFile,
        service: String,
        retention: CircuitRetention? = nil,
        releaseMemory: (@Sendable () -> Void)? = nil
    ) async throws -> (OverlayGateway, TestBackend) {
        let backend = try await TestBackend.start()
        var proxy = ProxyConfiguration(backend: BackendURL(host: "127.0.0.1", port: backend.port))
        configureProxy(&proxy)
        let gateway = try OverlayGateway(
            identity: identity,
            service: service,
            proxy: proxy,
            logger: logger,
            handshakeTimeout: ClusterDeadlines.e2eHandshake,
            keepalive: ClusterDeadlines.keepalive,
            retention: retention
                ?? CircuitRetention(
                    grace: ClusterDeadlines.resumeGrace,
                    budget: RetentionBudget(limit: CircuitRetention.defaultTotal)
                ),
            releaseMemory: releaseMemory
        )
        tasks.append(Task { try await gateway.run() })
        backends.append(backend)
        gateways.append(gateway)
        return (gateway, backend)
    }

    /// Starts a tunnel for `identity` on a free loopback port; returns the port.
    @discardableResult
    public func startTunnel(identity: IdentityFile, service: String = "claude-api") async throws -> Int {
        // A short grace: a test's tunnel whose cluster stopped under an open circuit would otherwise keep trying to
        // resume it for the standard 60 s, connecting again every 2 s, in a process that runs many clusters.
        let tunnel = try Tunnel(
            identity: identity,
            service: service,
            listen: HostPort(host: "127.0.0.1", port: 0),
            allowRemote: false,
            keepalive: ClusterDeadlines.keepalive,
            retention: CircuitRetention(grace: TestTiming.scaled(.seconds(10))),
            logger: logger
        )
        let port = try await tunnel.start().port!
        if self.tunnel == nil {
            self.tunnel = tunnel
            self.tunnelPort = port
        } else {
            moreTunnels.append(tunnel)
        }
        return port
    }

    /// How often the cluster's controllers read the controller list and push it to gateways when it changed: short,
    /// so a test waits for a replica to be linked in a fraction of a second rather than a heartbeat interval.
    static let rosterInterval: Duration = .milliseconds(500)

    /// Starts a second controller replica in this process on a free port, sharing the first controller's store
    /// object, CA and token key, with a TLS certificate of its own for 127.0.0.1 (as `controller join` makes one).
    /// Both controllers write a heartbeat, so each lists the other (`GET /v1/controllers`, the list gateways and
    /// enrollments get). Returns the replica's address.
    ///
    /// `store`, when given, is the replica's own store object on the same database (its own pool and change feed, as
    /// a replica in another process has), which `stop` closes.
    @discardableResult
    public func startReplica(store: (any ControllerStore)? = nil, attempts: Int = 5) async throws
        -> ControllerAddress
    {
        for attempt in 1...attempts {
            let port = try Self.freePort()
            let address = try ControllerAddress(parsing: "https://127.0.0.1:\(port)")
            let issued = try state.authority.issueServerCertificate(host: "127.0.0.1")
            let replica = state.replica(
                address: address,
                serverCertificatePEM: issued.certificatePEM + "\n" + state.authority.certificatePEM,
                serverKeyPEM: issued.privateKeyPEM,
                store: store
            )
            try await replica.identities.reload(from: replica.store)
            replica.roster.announceAloneAfter(.zero)
            let server = try ControllerServer(
                state: replica,
                listen: HostPort(host: "127.0.0.1", port: port),
                logger: logger,
                handshakeTimeout: ClusterDeadlines.tlsHandshake,
                circuitOpenTimeout: ClusterDeadlines.circuitOpen,
                keepalive: ClusterDeadlines.keepalive,
                rosterInterval: Self.rosterInterval
            )
            do {
                _ = try await server.start()
            } catch {
                guard attempt < attempts, error.reason.contains("Address already in use") else { throw error }
                continue
            }
            replicas.append((server, replica))
            if let store { restartedStores.append(store) }
            await beat()
            return address
        }
        preconditionFailure("the last attempt returns or throws")
    }

    /// Writes every controller's heartbeat now, so each lists the others.
    public func beat() async {
        for state in [state] + replicas.map(\.state) {
            await ControllerHeartbeat(state: state, logger: logger).beat()
        }
    }

    /// Stops replica `index` and ages its heartbeat out of the store's list at once, as 30 s without one would: the
    /// other controllers drop it from the list they push.
    public func retireReplica(_ index: Int) async throws {
        let replica = replicas[index]
        await replica.server.shutdown()
        try await replica.state.store.heartbeat(
            ControllerMember(address: replica.state.address.description, startedAt: 0, lastSeenAt: 0)
        )
    }

    /// Brings every replica's in-memory directory up to what the shared store holds (identities made through the
    /// first controller since the replica started), and its gateways' grants with it, as a replica's store feed
    /// would: the SQLite store has no change feed to do it. (A gateway admits a device only if every controller's
    /// grant holds it.)
    public func syncReplicas() async throws {
        for replica in replicas { try await replica.server.reloadDirectory() }
    }

    /// Stops the controller and starts a new one on the same port and state directory.
    public func restartController() async throws {
        await controller.shutdown()  // idempotent: fine if it is already down
        let reloaded = try await ControllerState.load(directory: "\(directory)/controller")
        reloaded.roster.announceAloneAfter(.zero)
        restartedStores.append(reloaded.store)
        let server = try ControllerServer(
            state: reloaded,
            listen: HostPort(host: "127.0.0.1", port: controllerPort),
            logger: logger,
            handshakeTimeout: ClusterDeadlines.tlsHandshake,
            circuitOpenTimeout: ClusterDeadlines.circuitOpen,
            keepalive: ClusterDeadlines.keepalive,
            rosterInterval: Self.rosterInterval
        )
        _ = try await server.start()
        controller = server
    }

    public func stop() async {
        for gateway in gateways { gateway.stop() }
        for task in tasks { _ = try? await task.value }
        await tunnel?.shutdown()
        for tunnel in moreTunnels { await tunnel.shutdown() }
        await controller.shutdown()
        for replica in replicas { await replica.server.shutdown() }
        for backend in backends { await backend.stop() }
        // Replicas share the first controller's store object unless given their own; each restart
        // (`restartController`) opened its own.
        await state.store.close()
        for store in restartedStores { await store.close() }
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Polls `condition` every 20 ms until it holds, for up to `limit`. The default is `TestTiming.hangGuard`: a
    /// wait for an event, whose bound only says how long a broken build takes to fail, never how fast a healthy one
    /// must be (docs/testing.md). Pass a shorter `limit` only where the bound is itself what the test claims.
    public static func eventually(
        _ limit: Duration = TestTiming.hangGuard,
        _ condition: () -> Bool
    ) async -> Bool {
        let clock = ContinuousClock()
        let deadline = clock.now + limit
        while clock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return condition()
    }

    public static func freePort() throws -> Int {
        let channel = try ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0).wait()
        let port = channel.localAddress!.port!
        try channel.close().wait()
        return port
    }
}
