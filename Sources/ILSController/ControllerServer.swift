public import ILSCore
public import ILSFabric
import ILSSplice
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP1
public import NIOPosix
import NIOSSL
import NIOTLS
public import ServiceLifecycle

/// The controller's one public port: TLS (client certificates optional, verified against the controller CA when
/// presented), HTTP/1.1, JSON. Enrollment needs no client certificate; the admin API needs an admin's.
public final class ControllerServer: Service, Sendable {
    /// The largest request body accepted; every API body is far smaller.
    static let maximumBodyBytes = 64 * 1024
    /// An API request's head must be in 10 s after its first byte (the first request's: after the handshake), its
    /// body 20 s after its head (at most 64 KiB: 6.4 s at 10 KB/s), and a keep-alive connection may sit 30 s between
    /// requests; see `APIRequestDeadlines`.
    public static let defaultRequestTimeouts = APIRequestDeadlines.Timeouts(
        head: .seconds(10),
        body: .seconds(20),
        idle: .seconds(30)
    )
    /// A controller serves a few hundred devices and gateways. Each device holds one overlay connection, each gateway
    /// one per controller event loop (up to the core count), plus short API calls: 4096 in total covers that with
    /// room to spare. Per source address 256: a gateway host with a few gateways on a many-core controller, or a
    /// hundred devices behind one NAT, and no single address can take more than a sixteenth of the port.
    public static let defaultConnectionLimits = ConnectionLimiter.Limits(total: 4096, perSource: 256)
    /// The request head of an API call: 64 KiB and 128 fields, as in HTTP mode. The API is open to anyone before
    /// authentication (enrollment), so parsing must stay cheap whatever a client sends; beyond this, 400 and close.
    static var headerLimits: NIOHTTPDecoderLimitConfiguration {
        var limits = NIOHTTPDecoderLimitConfiguration()
        limits.maxHeaderListSize = 64 * 1024
        limits.maxHeaderFieldSize = 64 * 1024
        limits.maxHeaderFieldCount = 128
        return limits
    }
    /// A connection gets this long for its TLS handshake; see `HandshakeDeadlineHandler`.
    public static let defaultHandshakeTimeout: TimeAmount = .seconds(10)
    /// How long a gateway may take to accept a circuit before the relay tries the next one.
    public static let defaultCircuitOpenTimeout: TimeAmount = .seconds(5)

    private let listen: HostPort
    private let group: MultiThreadedEventLoopGroup
    private let logger: Logger
    private let router: ControllerRouter
    private let overlay: ControllerOverlay
    private let relay: Relay
    private let tlsContext: NIOSSLContext
    private let channel = NIOLockedValueBox<(any Channel)?>(nil)
    private let connections = ChildChannelRegistry()
    private let handshakeTimeout: TimeAmount
    private let requestTimeouts: APIRequestDeadlines.Timeouts
    private let limiter: ConnectionLimiter
    private let follower: StoreFollower
    private let following = NIOLockedValueBox<Task<Void, Never>?>(nil)
    private let rosterTask = NIOLockedValueBox<Task<Void, Never>?>(nil)
    private let memoryTask = NIOLockedValueBox<Task<Void, Never>?>(nil)
    /// Hands freed memory back to the system (`malloc_trim`, from the executable) through `MemoryRelease`, so the
    /// buffers of many closed circuits (100 stalled downloads held 3.5 MB each) do not stay with the process as
    /// fragmented free heap.
    private let releaseMemory: (@Sendable () -> Void)?
    /// How often the controller list is read from the store and pushed to gateways when it changed.
    private let rosterInterval: Duration
    private let controller: Controller
    private let live: LiveConnections

    public init(
        state: ControllerState,
        listen: HostPort,
        group: MultiThreadedEventLoopGroup = .singleton,
        logger: Logger,
        handshakeTimeout: TimeAmount = ControllerServer.defaultHandshakeTimeout,
        circuitOpenTimeout: TimeAmount = ControllerServer.defaultCircuitOpenTimeout,
        keepalive: FabricKeepalive = .standard,
        requestTimeouts: APIRequestDeadlines.Timeouts = ControllerServer.defaultRequestTimeouts,
        connectionLimits: ConnectionLimiter.Limits = ControllerServer.defaultConnectionLimits,
        circuitLimits: CircuitLimiter.Limits = .standard,
        rosterInterval: Duration = ControllerHeartbeat.interval,
        releaseMemory: (@Sendable () -> Void)? = nil
    ) throws(ILSError) {
        self.releaseMemory = releaseMemory
        self.rosterInterval = rosterInterval
        self.listen = listen
        self.requestTimeouts = requestTimeouts
        self.limiter = ConnectionLimiter(limits: connectionLimits)
        self.handshakeTimeout = handshakeTimeout
        self.group = group
        self.logger = logger
        let controller = Controller(state: state)
        let live = LiveConnections()
        self.controller = controller
        self.live = live
        let relay = Relay(
            controller: controller,
            live: live,
            gatewayTimeout: circuitOpenTimeout,
            circuitLimits: circuitLimits,
            logger: logger
        )
        self.relay = relay
        self.router = ControllerRouter(controller: controller, live: live, relay: relay, logger: logger)
        self.follower = StoreFollower(controller: controller, relay: relay, live: live, logger: logger)
        self.overlay = ControllerOverlay(
            controller: controller,
            relay: relay,
            live: live,
            loops: RelayLoops(group),
            keepalive: keepalive,
            logger: logger
        )
        do {
            let chain = try NIOSSLCertificate.fromPEMBytes(Array(state.serverCertificatePEM.utf8))
            let key = try NIOSSLPrivateKey(bytes: Array(state.serverKeyPEM.utf8), format: .pem)
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: chain.map { .certificate($0) },
                privateKey: .privateKey(key)
            )
            // Every client of this port is ours (ILSClient, the CLI, the tunnel, the gateway; all BoringSSL through
            // swift-nio-ssl), so TLS 1.3 only: BoringSSL's three TLS 1.3 suites (AES-128/256-GCM, ChaCha20-Poly1305)
            // are all AEAD with an ephemeral key exchange (RFC 8446 §9.1), so there is no CBC suite to offer and no
            // weak suite a client's order could pick, which is what a server cipher order guards against in TLS 1.2.
            configuration.minimumTLSVersion = .tlsv13
            configuration.trustRoots = .certificates(
                try NIOSSLCertificate.fromPEMBytes(Array(state.authority.certificatePEM.utf8))
            )
            configuration.certificateVerification = .optionalVerification
            // Identity certificates hold Ed25519 keys: accept their CertificateVerify signatures (RFC 8446 §4.2.3).
            configuration.verifySignatureAlgorithms = [
                .ed25519, .ecdsaSecp256R1Sha256, .ecdsaSecp384R1Sha384, .rsaPssRsaeSha256, .rsaPssRsaeSha384,
                .rsaPkcs1Sha256,
            ]
            // A device of this release offers `ils-dial/2` then `/1`; the server's order decides, so it gets `/2`.
            configuration.applicationProtocols = [
                FabricProtocol.dialEarlyALPN, FabricProtocol.dialALPN, FabricProtocol.hostALPN, FabricProtocol.apiALPN,
            ]
            tlsContext = try NIOSSLContext(configuration: configuration)
        } catch {
            throw ILSError(
                .invalidInput,
                "the controller's TLS certificate or key could not be loaded",
                detail: "\(error)"
            )
        }
    }

    /// The store's maintenance for this server's controller: as `StoreMaintenance(state:...)`, and when its reload
    /// changes services or attributes, the policies are enforced again here (circuits cut, grants sent).
    public func maintenance(
        retention: StoreMaintenance.Retention,
        interval: TimeSpan = StoreMaintenance.defaultInterval
    ) -> StoreMaintenance {
        StoreMaintenance(
            state: controller.state,
            retention: retention,
            interval: interval,
            policies: PolicyEnforcement(controller: controller, relay: relay, live: live, logger: logger),
            logger: logger
        )
    }

    /// Reads the whole directory again and enforces the policies if that changed them, as the maintenance pass's
    /// backstop does (and the store's feed does change by change): gateways linked here get the grants the reload
    /// changed. For tests whose replicas share a SQLite store, which has no feed.
    package func reloadDirectory() async throws(ILSError) {
        let before = PolicyEnforcement.Inputs(controller.state.identities)
        try await controller.state.identities.reload(from: controller.state.store)
        PolicyEnforcement(controller: controller, relay: relay, live: live, logger: logger).reloaded(before: before)
    }

    /// Circuits spliced so far, by whether the device's and the gateway's streams shared an event loop.
    package var splices: (sameLoop: Int, crossLoop: Int) { relay.splices }
    /// The gateways hosting each service through this controller, as the relay sees them (tests).
    package var hosting: [String: [ControllerAPI.ServiceHost]] { relay.hosting() }

    /// Binds and starts serving in the background of `run`. Returns the bound address.
    public func start() async throws(ILSError) -> SocketAddress {
        // Every service's grant, computed once before any gateway links (there is nobody to send it to yet): the
        // relay then re-sends a grant only for a device that really was not in the last one.
        PolicyEnforcement(controller: controller, relay: relay, live: live, logger: logger).enforce()
        let tlsContext = self.tlsContext
        let router = self.router
        let logger = self.logger
        let overlay = self.overlay
        let connections = self.connections
        let handshakeTimeout = self.handshakeTimeout
        let requestTimeouts = self.requestTimeouts
        let limitHandler = ConnectionLimitHandler(limiter: limiter, observer: Self.limitObserver(logger: logger))
        let server: any Channel
        do {
            server = try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                // Devices, gateways and API callers all count: the caps refuse at accept, before TLS.
                .serverChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(limitHandler)
                    }
                }
                // Relayed circuits carry small interactive records (an SSE event, a request head): Nagle would hold
                // each behind the previous one's ACK.
                .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
                .childChannelOption(.writeBufferWaterMark, value: WriteBuffers.overlayConnection)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        connections.add(channel)
                        let pipeline = channel.pipeline.syncOperations
                        try pipeline.addHandler(NIOSSLServerHandler(context: tlsContext))
                        try pipeline.addHandler(HandshakeDeadlineHandler(deadline: handshakeTimeout))
                        // ALPN tells the connection kinds apart on the one port.
                        try pipeline.addHandler(
                            ApplicationProtocolNegotiationHandler { result, channel in
                                switch result {
                                case .negotiated(FabricProtocol.dialALPN):
                                    return overlay.afterLearning(channel) { try overlay.configureDevice(channel) }
                                case .negotiated(FabricProtocol.dialEarlyALPN):
                                    return overlay.afterLearning(channel) {
                                        try overlay.configureDevice(channel, earlyData: CircuitAcceptor.earlyDataLimit)
                                    }
                                case .negotiated(FabricProtocol.hostALPN):
                                    return overlay.afterLearning(channel) { try overlay.configureGateway(channel) }
                                default:
                                    return channel.eventLoop.makeCompletedFuture {
                                        try Self.configureAPIPipeline(
                                            channel.pipeline.syncOperations,
                                            router: router,
                                            logger: logger,
                                            timeouts: requestTimeouts,
                                            clientCertificate: ControllerHTTPHandler.verifiedTLSClientCertificate
                                        )
                                    }
                                }
                            }
                        )
                    }
                }
                .bind(host: listen.host, port: listen.port).get()
        } catch {
            throw ILSError(.unavailable, "could not listen on \(listen): \(error)")
        }
        channel.withLockedValue { $0 = server }
        let follower = self.follower
        following.withLockedValue { $0 = Task { await follower.follow() } }
        let (controller, live, interval) = (self.controller, self.live, rosterInterval)
        rosterTask.withLockedValue {
            $0 = Task {
                // The store's change feed says when a replica joins; SQLite's has no such events, and a replica that
                // stops beating only ages out of the list, so it is read again every interval as well.
                while !Task.isCancelled {
                    await controller.state.roster.refresh(controller: controller, live: live)
                    try? await Task.sleep(for: interval)
                }
            }
        }
        if let releaseMemory {
            let limiter = relay.circuitLimiter
            memoryTask.withLockedValue {
                $0 = Task { await MemoryRelease.run(closed: { limiter.releasedTotal }, release: releaseMemory) }
            }
        }
        guard let address = server.localAddress else { throw ILSError(.internalError, "no local address") }
        return address
    }

    /// The JSON API on an accepted connection after TLS: fixed deadlines for each request's head and body and for
    /// idle spells, HTTP/1.1 within `headerLimits`, and `ControllerHTTPHandler`, which takes the caller's identity
    /// from `clientCertificate`.
    private static func configureAPIPipeline(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        router: ControllerRouter,
        logger: Logger,
        timeouts: APIRequestDeadlines.Timeouts,
        answering: ControllerHTTPHandler.Answering = .task,
        clientCertificate: @escaping ControllerHTTPHandler.ClientCertificate
    ) throws {
        try pipeline.addHandler(
            APIRequestDeadlineHandler(timeouts: timeouts) { ControllerMetrics.refusal("request_timeout") }
        )
        try pipeline.configureHTTPServerPipeline(
            withPipeliningAssistance: true,
            withServerUpgrade: nil,
            withErrorHandling: true,
            withOutboundHeaderValidation: true,
            withEncoderConfiguration: .init(),
            withDecoderLimitConfiguration: Self.headerLimits
        )
        try pipeline.addHandler(
            ControllerHTTPHandler(
                router: router,
                logger: logger,
                maximumBodyBytes: Self.maximumBodyBytes,
                answering: answering,
                clientCertificate: clientCertificate
            )
        )
    }

    /// Circuits an identity holds open through this controller now, as its cap counts them (for tests).
    /// Closes every connection of the identity, as a network that drops them would (tests: resumption).
    package func dropConnections(identityID: String) {
        live.close(identityID: identityID)
    }

    package func openCircuits(identityID: String) -> Int {
        relay.circuitLimiter.open(identityID: identityID)
    }

    /// Sets up the API pipeline of an accepted connection on a channel that carries the client's plaintext bytes,
    /// with `clientCertificate` standing in for the chain TLS verified. The fuzz targets drive the API this way, on
    /// an `EmbeddedChannel`, so each answer is waited for on the calling thread.
    package func configureAPIConnection(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        clientCertificate: [UInt8]?
    ) throws {
        try Self.configureAPIPipeline(
            pipeline,
            router: router,
            logger: logger,
            timeouts: requestTimeouts,
            answering: .waitingOnCallerThread
        ) { _ in clientCertificate }
    }

    /// Counts open connections and refusals of the caps, and logs a refusal once per source per minute.
    private static func limitObserver(logger: Logger) -> ConnectionLimitHandler.Observer {
        ConnectionLimitHandler.Observer(
            openChanged: { ControllerMetrics.connectionsOpen.record($0) },
            refused: { refusal in
                ControllerMetrics.connectionRefused(refusal.cap)
                guard refusal.logged else { return }
                logger.warning(
                    "connection refused: too many open connections",
                    metadata: [
                        "source": "\(refusal.source)", "cap": "\(refusal.cap.rawValue)",
                        "unlogged_refusals": "\(refusal.unlogged)",
                    ]
                )
            }
        )
    }

    /// Stops listening and closes every connection: API clients, devices and gateways (which reconnect to the
    /// next controller on their own).
    public func shutdown() async {
        let server = channel.withLockedValue { channel in
            defer { channel = nil }
            return channel
        }
        try? await server?.close()
        connections.closeAll()
        following.withLockedValue { $0 }?.cancel()
        rosterTask.withLockedValue { $0 }?.cancel()
        memoryTask.withLockedValue { $0 }?.cancel()
    }

    public func run() async throws {
        let address = try await start()
        logger.info(
            "controller listening",
            metadata: ["listen": "https://\(address.ipAddress ?? "?"):\(address.port ?? 0)"]
        )
        try? await gracefulShutdown()
        await shutdown()
        logger.info("controller stopped")
    }
}
