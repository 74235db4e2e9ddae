import ILSClient
public import ILSCore
import ILSCrypto
public import ILSFabric
public import ILSProxy
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP2
import NIOPosix
public import ServiceLifecycle

/// `serve --mode ziti`: the dark gateway. It opens no listening socket of any kind: it dials out to the controller
/// (mTLS, `ils-host/1`), hosts one service, and serves each circuit the controller opens to it — end-to-end
/// handshake, its own access decision, then the same proxy core as HTTP mode. After a lost connection it reconnects
/// forever with jittered backoff capped at a few seconds.
public final class OverlayGateway: Service, Sendable {
    /// The identity in use: replaced when the certificate is renewed (new connections and circuits use it).
    private let identity:
        NIOLockedValueBox<
            (
                file: IdentityFile, connector: FabricConnector,
                credentials: E2EHandshake.Credentials
            )
        >
    /// Where the identity file lives, for renewal; `nil` disables automatic renewal.
    private let identityPath: String?
    private let service: String
    private let handshakeTimeout: TimeAmount
    private let core: ProxyCore
    private let logger: Logger
    private let policy = GatewayPolicy()
    private let eventLoop: any EventLoop
    private let current = NIOLockedValueBox<(channel: (any Channel)?, stopped: Bool)>((nil, false))
    private let isConnected = NIOLockedValueBox(false)

    /// - Parameter identityPath: the identity file, so the gateway can renew its certificate by itself before it
    ///   expires; without it, renewal is left to `ils-gateway renew`.
    public init(
        identity: IdentityFile,
        identityPath: String? = nil,
        service: String,
        proxy: ProxyConfiguration,
        logger: Logger,
        handshakeTimeout: TimeAmount = E2EResponderHandler.handshakeTimeout
    ) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); serving needs a gateway identity"
            )
        }
        self.identity = NIOLockedValueBox(try Self.load(identity))
        self.identityPath = identityPath
        self.service = service
        self.handshakeTimeout = handshakeTimeout
        // One event loop carries the controller connection, its circuits and their backend connections, so a
        // circuit and its backend request never hop threads.
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        // All backend connections live on that one loop, so it gets the whole `--backend-max-connections`: split
        // between the machine's cores, half of it would answer 503 beyond ~8,000 concurrent streams.
        self.core = ProxyCore(configuration: proxy, logger: logger, loopCount: 1)
        self.logger = logger
    }

    private static func load(_ file: IdentityFile) throws(ILSError) -> (
        file: IdentityFile, connector: FabricConnector, credentials: E2EHandshake.Credentials
    ) {
        (
            file,
            try FabricConnector(identity: file, alpn: FabricProtocol.hostALPN),
            try E2EHandshake.Credentials(
                certificatePEM: file.certificate,
                privateKeyPEM: file.privateKey,
                caCertificatePEM: file.caCertificate
            )
        )
    }

    /// How often the gateway checks whether its certificate is due for renewal.
    static let renewalCheckInterval: Duration = .seconds(6 * 3600)

    /// Renews the certificate when due, then moves to it at the next quiet moment: the controller connection is
    /// re-made only while no circuit is live, so no stream is cut for a renewal.
    private func renewalLoop() async {
        guard let identityPath else { return }
        while !(current.withLockedValue { $0.stopped }) {
            do {
                try await Task.sleep(for: Self.renewalCheckInterval)
            } catch {
                return  // cancelled: the gateway is stopping
            }
            guard Renewal.isDue(identity.withLockedValue { $0.file }) else { continue }
            do {
                let renewed = try await Renewal.renew(path: identityPath)
                let loaded = try Self.load(renewed)
                identity.withLockedValue { $0 = loaded }
                logger.info("certificate renewed", metadata: ["until": "\(renewed.identity.certificateNotAfter ?? 0)"])
                while policy.liveCircuits > 0 {
                    do { try await Task.sleep(for: .seconds(30)) } catch { return }
                }
                current.withLockedValue { $0.channel }?.close(promise: nil)
            } catch {
                logger.warning("certificate renewal failed; will retry", metadata: ["error": "\(error.reason)"])
            }
        }
    }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await withDiscardingTaskGroup { group in
                group.addTask { await self.renewalLoop() }
                await self.connectLoop()
                group.cancelAll()
            }
        } onGracefulShutdown: {
            self.stop()
        }
    }

    /// Stops reconnecting and closes the connection (and with it every circuit).
    public func stop() {
        let channel = current.withLockedValue { state -> (any Channel)? in
            state.stopped = true
            return state.channel
        }
        channel?.close(promise: nil)
    }

    /// Whether the gateway's own block list holds this identity (revoked or disabled).
    public func blocks(identityID: String) -> Bool { policy.blocks(identityID) }

    /// Whether the gateway is connected and has its policy from the controller (for tests and readiness).
    public var isHosting: Bool { isConnected.withLockedValue { $0 } && policy.isKnown }

    private func connectLoop() async {
        var backoff = Backoff()
        var lastFailure: String?
        while !(current.withLockedValue { $0.stopped }) {
            do {
                let channel = try await connect().get()
                let stopped = current.withLockedValue { state -> Bool in
                    state.channel = channel
                    return state.stopped
                }
                if stopped { channel.close(promise: nil) }
                backoff.reset()
                lastFailure = nil
                logger.info(
                    "connected to controller",
                    metadata: [
                        "controller": "\(identity.withLockedValue { $0.connector.address })",
                        "service": "\(service)",
                    ]
                )
                isConnected.withLockedValue { $0 = true }
                GatewayMetrics.connected.record(1)
                try? await channel.closeFuture.get()
                isConnected.withLockedValue { $0 = false }
                GatewayMetrics.connected.record(0)
                policy.connectionLost()
                if current.withLockedValue({ $0.stopped }) { break }
                logger.warning("lost the controller connection; reconnecting")
            } catch {
                let description = (error as? ILSError)?.reason ?? "\(error)"
                if description != lastFailure {
                    logger.warning(
                        "cannot reach the controller; retrying with backoff",
                        metadata: [
                            "controller": "\(identity.withLockedValue { $0.connector.address })",
                            "error": "\(description)",
                        ]
                    )
                    lastFailure = description
                } else {
                    logger.debug("controller still unreachable", metadata: ["error": "\(description)"])
                }
            }
            try? await Task.sleep(nanoseconds: UInt64(backoff.next().nanoseconds))
        }
    }

    private func connect() -> EventLoopFuture<any Channel> {
        let (connector, credentials) = identity.withLockedValue { ($0.connector, $0.credentials) }
        var settings = GatewayStreamRouter.Context(
            service: service,
            credentials: credentials,
            policy: policy,
            core: core,
            logger: logger,
            onRefusal: { [logger] reason in
                logger.error(
                    "the controller refused to let this gateway host the service",
                    metadata: [
                        "reason": "\(reason)"
                    ]
                )
            }
        )
        settings.handshakeTimeout = handshakeTimeout
        let router = settings
        let logger = self.logger
        return connector.connect(on: eventLoop) { channel in
            try channel.pipeline.syncOperations.configureFabricHTTP2(mode: .server) { GatewayStreamRouter(router) }
            try channel.pipeline.syncOperations.addHandler(
                FabricConnectionErrorHandler { [logger] error in
                    logger.warning("controller connection failed; reconnecting", metadata: ["error": "\(error)"])
                }
            )
        }
    }
}
