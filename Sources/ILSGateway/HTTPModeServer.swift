public import ILSCore
import ILSCrypto
import ILSFabric
import ILSIdentity
import ILSProxy
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOExtras
public import NIOPosix
import NIOSSL
public import ServiceLifecycle

/// The HTTP-mode gateway: accepts TCP connections, terminates TLS, and hands each connection to the proxy core.
///
/// With `devices` configured, TLS requires a client certificate from the controller's CA, and only active device
/// identities get through (`DeviceGate`); the gateway then holds a policy link to the controller (`PolicyLink`)
/// that brings the dial policy and the block list, and closes a device's connections when it is blocked.
///
/// As a `Service` it binds, serves until graceful shutdown is requested (SIGTERM/SIGINT through the service
/// group), then stops accepting, lets in-flight requests finish for up to the drain timeout, and closes the rest.
public final class HTTPModeServer: Service, Sendable {
    private let configuration: HTTPModeConfiguration
    private let group: any EventLoopGroup
    private let logger: Logger
    private let core: ProxyCore
    private let tlsContext: NIOSSLContext?
    private let children = ChildChannelRegistry()
    private let state = NIOLockedValueBox<(channel: (any Channel)?, quiesce: ServerQuiescingHelper?)>((nil, nil))
    /// What the controller says (dial policy, block list) and the live connections by identity; with `devices` only.
    private let policy: GatewayPolicy?
    private let link: PolicyLink?
    private let linkTask = NIOLockedValueBox<Task<Void, Never>?>(nil)

    /// Reads the TLS files now, so a bad certificate fails the command before anything listens.
    public init(
        configuration: HTTPModeConfiguration,
        group: any EventLoopGroup = MultiThreadedEventLoopGroup.singleton,
        logger: Logger
    ) throws(ILSError) {
        self.configuration = configuration
        self.group = group
        self.logger = logger
        self.core = ProxyCore(
            configuration: configuration.proxy.countingStalls(GatewayMetrics.httpClientStalled),
            logger: logger
        )
        if let devices = configuration.devices {
            guard let files = configuration.tls else {
                throw ILSError(.invalidArgument, "client certificates need TLS: give --tls-cert and --tls-key")
            }
            let policy = GatewayPolicy()
            self.policy = policy
            self.link = try PolicyLink(
                identity: devices.identity,
                service: devices.service,
                policy: policy,
                identityPath: devices.identityPath,
                renewalCheck: devices.renewalCheck,
                recheckInterval: devices.recheckInterval,
                now: devices.now,
                grace: devices.policyGrace.timeAmountValue,
                keepalive: devices.keepalive,
                logger: logger
            )
            self.tlsContext = try ServerTLSProfile.context(
                certificateChain: files.certificateChain,
                privateKey: files.privateKey,
                clientCA: devices.identity.caCertificate
            )
        } else {
            self.policy = nil
            self.link = nil
            self.tlsContext = try configuration.tls.map { files throws(ILSError) in
                try ServerTLSProfile.context(certificateChain: files.certificateChain, privateKey: files.privateKey)
            }
        }
    }

    /// Whether requests can be served: always without client certificates; with them, once the controller's policy
    /// is in force (readiness, tests).
    public var isReady: Bool { link?.hasPolicy ?? true }

    /// The certificate the policy link dials with (tests: it follows renewals).
    package var policyLinkCertificate: String? { link?.certificate }

    /// Whether the policy link is up and bound to the controller (tests).
    package var policyLinkIsBound: Bool { link?.isBound ?? false }

    /// The controllers the policy links go to: the identity file's, then the others the cluster lists (tests).
    package var policyLinkControllers: [String] { link?.linkedControllers ?? [] }

    /// Whether every policy link is up and bound (tests).
    package var policyLinksBound: Bool { link?.allBound ?? false }

    /// The certificate the bound policy link was dialled with, if it is bound (tests: a renewal's new link).
    package var policyLinkBoundCertificate: String? { link?.boundCertificate }

    /// Backend connections whose reads are held because their client cannot take more (tests: backpressure).
    package var heldBackendReads: Int { core.pools.heldReads }

    /// Whether the policy in force lets this device in (tests: the grant the controller pushes after an enrollment
    /// has arrived). Always true without client certificates.
    package func admits(certificatePEM: String) -> Bool {
        guard let policy, let service = configuration.devices?.service else { return true }
        guard let peer = try? IdentityCertificate(pem: certificatePEM) else { return false }
        if case .allow = policy.decide(peer, service: service, hosted: service) { return true }
        return false
    }

    /// Replaces the grant in force with `identities`, as a grant the controller pushed would (tests: a grant that is
    /// behind the controller's directory). Returns whether it was applied.
    @discardableResult
    package func applyGrant(_ identities: [String]) -> Bool {
        guard let policy, let service = configuration.devices?.service else { return false }
        return policy.updateGrant(
            DialGrant(service: service, policy: "test", identities: identities),
            hosted: service
        )
    }

    /// Whether the block list from the controller holds this identity (tests).
    public func blocks(identityID: String) -> Bool { policy?.blocks(identityID) ?? false }

    /// How many client connections of verified identities are open (tests).
    public var identifiedConnections: Int { policy?.liveCircuits ?? 0 }

    /// Binds the listening socket and starts accepting. Returns the bound address (useful with port 0).
    public func start() async throws(ILSError) -> SocketAddress {
        let quiesce = ServerQuiescingHelper(group: group)
        let limitHandler = Self.connectionLimitHandler(configuration.connectionLimits, logger: logger)
        let core = self.core
        let tlsContext = self.tlsContext
        let children = self.children
        let scheme: ClientContext.Scheme = tlsContext == nil ? .http : .https
        let hstsMaxAge = tlsContext == nil ? nil : configuration.hstsMaxAge.map { $0.nanoseconds / 1_000_000_000 }
        var check: (@Sendable (IdentityCertificate, any EventLoop) -> EventLoopFuture<PolicyLink.CheckResult>)?
        var admitted: (@Sendable (any Channel, IdentityCertificate) -> Void)?
        if let link {
            check = { @Sendable peer, eventLoop in link.check(peer, on: eventLoop) }
            admitted = { @Sendable channel, peer in link.admitted(channel, peer: peer) }
        }
        let gate = policy.map { policy -> DeviceGate.Settings in
            DeviceGate.Settings(
                core: core,
                policy: policy,
                service: configuration.devices?.service ?? "",
                hstsMaxAge: hstsMaxAge,
                logger: logger,
                handshakeTimeout: configuration.proxy.clientIdleTimeout.timeAmountValue,
                check: check,
                admitted: admitted
            )
        }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 1024)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    // First, so a connection beyond the caps is closed before anything else counts or tracks it.
                    try channel.pipeline.syncOperations.addHandler(limitHandler)
                    try channel.pipeline.syncOperations.addHandler(quiesce.makeServerChannelHandler(channel: channel))
                }
            }
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    children.add(channel)
                    let pipeline = channel.pipeline.syncOperations
                    try pipeline.addHandler(ReadAheadHandler())
                    if let tlsContext {
                        try pipeline.addHandler(NIOSSLServerHandler(context: tlsContext))
                    }
                    if let gate {
                        // The rest of the pipeline waits for the handshake and the verified certificate.
                        try pipeline.addHandler(DeviceGate(gate))
                        return
                    }
                    try core.configureClientPipeline(
                        pipeline,
                        client: ClientContext(remoteAddress: channel.remoteAddress, scheme: scheme)
                    )
                    if let hstsMaxAge { try StrictTransportSecurityHandler.install(pipeline, maxAge: hstsMaxAge) }
                }
            }
        let channel: any Channel
        do {
            channel = try await bootstrap.bind(host: configuration.listen.host, port: configuration.listen.port).get()
        } catch {
            throw ILSError(
                .unavailable,
                "could not listen on \(configuration.listen): \(error)",
                detail: "\(error)"
            )
        }
        state.withLockedValue { $0 = (channel, quiesce) }
        if let link {
            linkTask.withLockedValue { $0 = Task { await link.run() } }
        }
        guard let address = channel.localAddress else {
            throw ILSError(.internalError, "the listening socket has no local address")
        }
        return address
    }

    /// Stops accepting, lets open requests finish for up to the drain timeout, then closes every connection.
    public func shutdown() async {
        guard let quiesce = state.withLockedValue({ $0.quiesce }) else { return }
        state.withLockedValue { $0 = (nil, nil) }
        link?.stop()
        if let task = linkTask.withLockedValue({ $0 }) { await task.value }
        let eventLoop = group.next()
        let drained = eventLoop.makePromise(of: Void.self)
        let children = self.children
        let deadline = eventLoop.scheduleTask(in: configuration.drainTimeout.timeAmountValue) {
            children.closeAll()
        }
        if children.count > 0 {
            logger.info(
                "draining connections",
                metadata: [
                    "open": "\(children.count)",
                    "deadline": "\(configuration.drainTimeout)",
                ]
            )
        }
        quiesce.initiateShutdown(promise: drained)
        try? await drained.futureResult.get()
        deadline.cancel()
    }

    public func run() async throws {
        let address = try await start()
        let scheme = tlsContext == nil ? "http" : "https"
        logger.info(
            "serving HTTP mode",
            metadata: [
                "listen": "\(scheme)://\(address.displayString)",
                "backend": "\(configuration.proxy.backend)",
            ]
        )
        try? await gracefulShutdown()
        logger.info("shutting down")
        await shutdown()
        logger.info("stopped")
    }
}

extension TimeSpan {
    var timeAmountValue: TimeAmount { .nanoseconds(nanoseconds) }
}

extension SocketAddress {
    /// `127.0.0.1:8443` or `[::1]:8443`.
    public var displayString: String {
        guard let ip = ipAddress, let port else { return "\(self)" }
        return ip.utf8.contains(UInt8(ascii: ":")) ? "[\(ip)]:\(port)" : "\(ip):\(port)"
    }
}
