public import ILSCore
public import Logging
import Metrics
import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP1
import NIOPosix
public import Prometheus
public import ServiceLifecycle

/// The opt-in `--metrics HOST:PORT` listener: Prometheus text on `/metrics`, liveness on `/healthz`, readiness on
/// `/readyz`. Loopback only unless explicitly allowed, so a dark gateway stays free of non-loopback listeners.
public final class MetricsServer: Service, Sendable {
    private let listen: HostPort
    private let registry: PrometheusCollectorRegistry
    private let ready: @Sendable () -> Bool
    private let beforeScrape: @Sendable () -> Void
    private let logger: Logger
    private let channel = NIOLockedValueBox<(any Channel)?>(nil)

    /// Bootstraps swift-metrics with a Prometheus registry (once per process) and prepares the listener.
    /// `beforeScrape` records the gauges that are read rather than counted (what a process holds now), so each
    /// scrape sees them as of its own moment.
    public init(
        listen: HostPort,
        allowRemote: Bool,
        logger: Logger,
        ready: @escaping @Sendable () -> Bool,
        beforeScrape: @escaping @Sendable () -> Void = {}
    ) throws(ILSError) {
        guard listen.isLoopback || allowRemote else {
            throw ILSError(
                .invalidArgument,
                "the metrics listener is loopback-only; give --metrics-allow-remote to listen on \(listen.host)"
            )
        }
        self.listen = listen
        self.registry = MetricsBootstrap.registry
        self.ready = ready
        self.beforeScrape = beforeScrape
        self.logger = logger
    }

    public func start() async throws(ILSError) -> SocketAddress {
        let registry = self.registry
        let ready = self.ready
        let beforeScrape = self.beforeScrape
        let server: any Channel
        do {
            server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                .childChannelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                        try channel.pipeline.syncOperations.addHandler(
                            MetricsHTTPHandler(
                                registry: registry,
                                ready: ready,
                                beforeScrape: beforeScrape
                            )
                        )
                    }
                }
                .bind(host: listen.host, port: listen.port).get()
        } catch {
            throw ILSError(.unavailable, "could not listen for metrics on \(listen): \(error)")
        }
        channel.withLockedValue { $0 = server }
        guard let address = server.localAddress else { throw ILSError(.internalError, "no local address") }
        return address
    }

    public func run() async throws {
        let address = try await start()
        logger.info("metrics listening", metadata: ["listen": "\(address.ipAddress ?? "?"):\(address.port ?? 0)"])
        try? await gracefulShutdown()
        let server = channel.withLockedValue { $0 }
        try? await server?.close()
    }
}

/// One process-wide Prometheus registry behind swift-metrics.
public enum MetricsBootstrap {
    public static let registry: PrometheusCollectorRegistry = {
        let registry = PrometheusCollectorRegistry()
        MetricsSystem.bootstrap(PrometheusMetricsFactory(registry: registry))
        return registry
    }()
}

final class MetricsHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let registry: PrometheusCollectorRegistry
    private let ready: @Sendable () -> Bool
    private let beforeScrape: @Sendable () -> Void
    private var path = ""

    init(
        registry: PrometheusCollectorRegistry,
        ready: @escaping @Sendable () -> Bool,
        beforeScrape: @escaping @Sendable () -> Void = {}
    ) {
        self.registry = registry
        self.ready = ready
        self.beforeScrape = beforeScrape
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch unwrapInboundIn(data) {
        case .head(let head): path = head.uri
        case .body: break
        case .end:
            let (status, type, body): (HTTPResponseStatus, String, [UInt8])
            switch path {
            case "/metrics":
                beforeScrape()
                (status, type, body) = (.ok, "text/plain; version=0.0.4", registry.emitToBuffer())
            case "/healthz": (status, type, body) = (.ok, "text/plain", Array("ok\n".utf8))
            case "/readyz":
                (status, type, body) =
                    ready()
                    ? (.ok, "text/plain", Array("ready\n".utf8))
                    : (.serviceUnavailable, "text/plain", Array("not ready\n".utf8))
            default: (status, type, body) = (.notFound, "text/plain", Array("not found\n".utf8))
            }
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: type)
            headers.add(name: "Content-Length", value: String(body.count))
            context.write(
                wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: status, headers: headers))),
                promise: nil
            )
            context.write(wrapOutboundOut(.body(.byteBuffer(ByteBuffer(bytes: body)))), promise: nil)
            context.writeAndFlush(wrapOutboundOut(.end(nil)), promise: nil)
        }
    }
}
