public import ILSCore
import ILSCrypto
import ILSFabric
public import ILSProxy
public import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP2
import NIOPosix
public import ServiceLifecycle

/// `serve --mode ziti`: the dark gateway. It opens no listening socket of any kind: it dials out to the controller
/// (mTLS, `ils-host/1`), hosts one service, and serves each circuit the controller opens to it — end-to-end
/// handshake, its own access decision, then the same proxy core as HTTP mode. After a lost connection it reconnects
/// forever with jittered backoff capped at a few seconds.
public final class OverlayGateway: Service, Sendable {
    private let identity: IdentityFile
    private let service: String
    private let connector: FabricConnector
    private let credentials: E2EHandshake.Credentials
    private let core: ProxyCore
    private let logger: Logger
    private let policy = GatewayPolicy()
    private let eventLoop: any EventLoop
    private let current = NIOLockedValueBox<(channel: (any Channel)?, stopped: Bool)>((nil, false))
    private let isConnected = NIOLockedValueBox(false)

    public init(identity: IdentityFile, service: String, proxy: ProxyConfiguration, logger: Logger) throws(ILSError) {
        guard identity.identity.role == .gateway else {
            throw ILSError(
                .permissionDenied,
                "identity '\(identity.identity.name)' has role \(identity.identity.role.rawValue); serving needs a gateway identity"
            )
        }
        self.identity = identity
        self.service = service
        self.connector = try FabricConnector(identity: identity, alpn: FabricProtocol.hostALPN)
        self.credentials = try E2EHandshake.Credentials(
            certificatePEM: identity.certificate,
            privateKeyPEM: identity.privateKey,
            caCertificatePEM: identity.caCertificate
        )
        // One event loop carries the controller connection, its circuits and their backend connections, so a
        // circuit and its backend request never hop threads.
        self.eventLoop = MultiThreadedEventLoopGroup.singleton.next()
        self.core = ProxyCore(configuration: proxy, logger: logger)
        self.logger = logger
    }

    public func run() async throws {
        await withGracefulShutdownHandler {
            await connectLoop()
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
                        "controller": "\(connector.address)",
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
                        metadata: ["controller": "\(connector.address)", "error": "\(description)"]
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
        let settings = GatewayStreamRouter.Context(
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
        return connector.connect(on: eventLoop) { channel in
            _ = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                mode: .server,
                connectionConfiguration: FabricSettings.connection,
                streamConfiguration: FabricSettings.stream
            ) { stream in
                stream.eventLoop.makeCompletedFuture {
                    try stream.pipeline.syncOperations.addHandler(GatewayStreamRouter(settings))
                }
            }
        }
    }
}
