import Hummingbird
import HummingbirdCore
import HummingbirdTLS
public import ILSCore
import ILSFabric
import ILSIdentity
public import Logging
import NIOCore
import NIOSSL

/// `admin console`: a Hummingbird server on loopback (or beyond it, with TLS only) that renders pages from the
/// controller's admin API as the admin identity it was started with, the way `kubectl proxy` or `tailscale web` act
/// for their user. It prints a one-time login URL once it listens.
public struct ConsoleServer: Sendable {
    let configuration: ConsoleConfiguration
    let calls: AdminCalls
    let sessions: ConsoleSessions
    let logger: Logger

    public init(configuration: ConsoleConfiguration, calls: AdminCalls, logger: Logger) throws(ILSError) {
        try configuration.validate()
        self.configuration = configuration
        self.calls = calls
        self.sessions = ConsoleSessions()
        self.logger = logger
    }

    /// Serves until SIGTERM or SIGINT. `announce` gets the first login URL (with the bound port) once the server
    /// listens; the secret in it goes nowhere else (never to the log).
    public func run(announce: @escaping @Sendable (String) -> Void) async throws {
        let library = try ConsoleTemplates.library()
        let router = Router(context: ConsoleContext.self)
        router.add(middleware: ConsoleGuard(sessions: sessions, configuration: configuration, logger: logger))
        ConsolePages(calls: calls, sessions: sessions, configuration: configuration, library: library, logger: logger)
            .register(on: router)
        let configuration = self.configuration
        let server = try Self.serverBuilder(configuration, logger: logger)
        let sessions = self.sessions
        let logger = self.logger
        let app = Application(
            router: router,
            server: server,
            configuration: ApplicationConfiguration(
                address: .hostname(configuration.host, port: configuration.port),
                serverName: nil
            ),
            onServerRunning: { channel in
                let port = channel.localAddress?.port ?? configuration.port
                let host = configuration.linkHost
                let scheme = configuration.scheme
                logger.notice("console listening", metadata: ["address": "\(scheme)://\(host):\(port)"])
                announce("\(scheme)://\(host):\(port)/login?t=\(sessions.mintLogin())")
            },
            logger: logger
        )
        try await app.runService()
    }

    /// HTTP/1 (inside TLS when configured) behind the connection caps, with `ConsoleDeadlines` on every connection.
    /// Hummingbird's idle timeout (30 s without a read) stays as a backstop; a form body also has 10 s of its own
    /// (`ConsoleGuard.collectForm`).
    static func serverBuilder(_ configuration: ConsoleConfiguration, logger: Logger) throws -> HTTPServerBuilder {
        let deadlines = configuration.deadlines
        let http = HTTP1Channel.Configuration(
            additionalChannelHandlers: [ConsoleDeadlineHandler(deadlines: deadlines)],
            idleTimeout: .seconds(30)
        )
        let limiter = ConnectionLimiter(
            limits: .init(total: configuration.maximumConnections, perSource: configuration.maximumConnectionsPerSource)
        )
        guard let certificate = configuration.tlsCertificatePath, let key = configuration.tlsKeyPath else {
            return HTTPServerBuilder { responder in
                ConsoleChildChannel(
                    base: HTTP1Channel(responder: responder, configuration: http),
                    limiter: limiter,
                    logger: logger
                )
            }
        }
        let tls = try Self.tls(certificate: certificate, key: key)
        return HTTPServerBuilder { responder in
            ConsoleChildChannel(
                base: try TLSChannel(HTTP1Channel(responder: responder, configuration: http), tlsConfiguration: tls),
                limiter: limiter,
                logger: logger
            )
        }
    }

    /// HTTP mode's profile (`ServerTLSProfile`): GCM suites only under TLS 1.2, one per key type, TLS 1.3 first.
    static func tls(certificate: String, key: String) throws(ILSError) -> TLSConfiguration {
        try ServerTLSProfile.configuration(certificateChain: certificate, privateKey: key)
    }
}
