public import ILSCore
import ILSFabric
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
    /// An idle connection is closed after this long.
    static let idleTimeout: TimeAmount = .seconds(30)
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

    public init(
        state: ControllerState,
        listen: HostPort,
        group: MultiThreadedEventLoopGroup = .singleton,
        logger: Logger,
        handshakeTimeout: TimeAmount = ControllerServer.defaultHandshakeTimeout,
        circuitOpenTimeout: TimeAmount = ControllerServer.defaultCircuitOpenTimeout
    ) throws(ILSError) {
        self.listen = listen
        self.handshakeTimeout = handshakeTimeout
        self.group = group
        self.logger = logger
        let controller = Controller(state: state)
        let live = LiveConnections()
        let relay = Relay(controller: controller, gatewayTimeout: circuitOpenTimeout, logger: logger)
        self.relay = relay
        self.router = ControllerRouter(controller: controller, live: live, relay: relay, logger: logger)
        self.overlay = ControllerOverlay(
            controller: controller,
            relay: relay,
            live: live,
            loops: RelayLoops(group),
            logger: logger
        )
        do {
            let chain = try NIOSSLCertificate.fromPEMBytes(Array(state.serverCertificatePEM.utf8))
            let key = try NIOSSLPrivateKey(bytes: Array(state.serverKeyPEM.utf8), format: .pem)
            var configuration = TLSConfiguration.makeServerConfiguration(
                certificateChain: chain.map { .certificate($0) },
                privateKey: .privateKey(key)
            )
            configuration.minimumTLSVersion = .tlsv12
            configuration.trustRoots = .certificates(
                try NIOSSLCertificate.fromPEMBytes(Array(state.authority.certificatePEM.utf8))
            )
            configuration.certificateVerification = .optionalVerification
            // Identity certificates hold Ed25519 keys: accept their CertificateVerify signatures (RFC 8446 §4.2.3).
            configuration.verifySignatureAlgorithms = [
                .ed25519, .ecdsaSecp256R1Sha256, .ecdsaSecp384R1Sha384, .rsaPssRsaeSha256, .rsaPssRsaeSha384,
                .rsaPkcs1Sha256,
            ]
            configuration.applicationProtocols = [
                FabricProtocol.dialALPN, FabricProtocol.hostALPN, FabricProtocol.apiALPN,
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

    /// Circuits spliced so far, by whether the device's and the gateway's streams shared an event loop.
    package var splices: (sameLoop: Int, crossLoop: Int) { relay.splices }

    /// Binds and starts serving in the background of `run`. Returns the bound address.
    public func start() async throws(ILSError) -> SocketAddress {
        let tlsContext = self.tlsContext
        let router = self.router
        let logger = self.logger
        let overlay = self.overlay
        let connections = self.connections
        let handshakeTimeout = self.handshakeTimeout
        let server: any Channel
        do {
            server = try await ServerBootstrap(group: group)
                .serverChannelOption(.backlog, value: 256)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                // Relayed circuits carry small interactive records (an SSE event, a request head): Nagle would hold
                // each behind the previous one's ACK.
                .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
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
                                channel.eventLoop.makeCompletedFuture {
                                    switch result {
                                    case .negotiated(FabricProtocol.dialALPN):
                                        try overlay.configureDevice(channel)
                                    case .negotiated(FabricProtocol.hostALPN):
                                        try overlay.configureGateway(channel)
                                    default:
                                        try Self.configureAPIPipeline(
                                            channel.pipeline.syncOperations,
                                            router: router,
                                            logger: logger,
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
        guard let address = server.localAddress else { throw ILSError(.internalError, "no local address") }
        return address
    }

    /// The JSON API on an accepted connection after TLS: idle timeout, HTTP/1.1 within `headerLimits`, and
    /// `ControllerHTTPHandler`, which takes the caller's identity from `clientCertificate`.
    private static func configureAPIPipeline(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        router: ControllerRouter,
        logger: Logger,
        clientCertificate: @escaping ControllerHTTPHandler.ClientCertificate
    ) throws {
        try pipeline.addHandler(IdleStateHandler(readTimeout: Self.idleTimeout))
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
                clientCertificate: clientCertificate
            )
        )
    }

    /// Sets up the API pipeline of an accepted connection on a channel that carries the client's plaintext bytes,
    /// with `clientCertificate` standing in for the chain TLS verified. The fuzz targets drive the API this way.
    package func configureAPIConnection(
        _ pipeline: ChannelPipeline.SynchronousOperations,
        clientCertificate: [UInt8]?
    ) throws {
        try Self.configureAPIPipeline(pipeline, router: router, logger: logger) { _ in clientCertificate }
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
