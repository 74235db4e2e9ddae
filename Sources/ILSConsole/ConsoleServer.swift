import Hummingbird
import HummingbirdCore
import HummingbirdTLS
public import ILSCore
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
        // A connection idle for 30 s is closed; a form body has 10 s (`ConsoleGuard.collectForm`).
        let http: HTTPServerBuilder = .http1(configuration: .init(idleTimeout: .seconds(30)))
        let server: HTTPServerBuilder
        if let certificate = configuration.tlsCertificatePath, let key = configuration.tlsKeyPath {
            server = try .tls(http, tlsConfiguration: try Self.tls(certificate: certificate, key: key))
        } else {
            server = http
        }
        let configuration = self.configuration
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

    static func tls(certificate: String, key: String) throws(ILSError) -> TLSConfiguration {
        do {
            let chain = try NIOSSLCertificate.fromPEMFile(certificate).map { NIOSSLCertificateSource.certificate($0) }
            let privateKey = try NIOSSLPrivateKey(file: key, format: .pem)
            var tls = TLSConfiguration.makeServerConfiguration(
                certificateChain: chain,
                privateKey: .privateKey(privateKey)
            )
            tls.minimumTLSVersion = .tlsv12
            return tls
        } catch {
            throw ILSError(.invalidInput, "could not read the console's TLS certificate or key: \(error)")
        }
    }
}
