import ArgumentParser
import ILSConfig
import ILSConsole
import ILSCore
import ILSIdentity
import NIOCore

/// `ils-gateway admin console`: the browser console, acting as the admin identity it is given.
struct ConsoleCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "console",
        abstract: "Run the admin console in a browser: identities with QR enrollment, sessions, services, audit.",
        discussion: """
            Serves web pages on 127.0.0.1:8090 (--listen) that call the controller's admin API as the admin \
            identity, the way `kubectl proxy` does. It prints a one-time login URL on stderr: open it in a browser \
            on this machine. The link works once and for 10 minutes; after it the browser holds a session cookie \
            (HttpOnly, SameSite=Strict) and the URL holds no secret. Every change is a form with a CSRF token. \
            Sessions live in memory: stopping the console signs everyone out. A signed-in console makes further \
            links for other devices (Sign in another device), shown as a QR code.

            The console refuses to listen beyond loopback without TLS (--tls-cert and --tls-key). To reach it from \
            a phone, host it in the overlay instead: a gateway serves it as a service only admin identities may dial \
            (docs/operations.md, "The admin console from a phone"); pass that service's name as --allowed-host.

            Examples:
              ils-gateway admin console
              ils-gateway admin --identity ops.json console --listen 127.0.0.1:0
              ils-gateway admin console --listen 127.0.0.1:8090 --allowed-host ils-console
            """
    )

    @ParentCommand var admin: AdminCommand
    @OptionGroup var identityOption: AdminIdentityOption

    @Option(help: "Where to listen, HOST:PORT (port 0 picks a free one).")
    var listen: String = "127.0.0.1:8090"

    @Option(name: .customLong("tls-cert"), help: "PEM certificate chain to serve HTTPS with (needed beyond loopback).")
    var tlsCertificate: String?

    @Option(name: .customLong("tls-key"), help: "PEM private key of --tls-cert.")
    var tlsKey: String?

    @Option(
        name: .customLong("allowed-host"),
        help: """
            A Host name the console answers to besides loopback ones, e.g. the service name it is hosted as in the \
            overlay. Repeat for several. Any other Host gets 421 (this is what stops DNS rebinding).
            """
    )
    var allowedHosts: [String] = []

    @Option(
        help: """
            Most connections open at once; beyond it a new connection is closed as it is accepted, before TLS. \
            Default: 64.
            """
    )
    var maxConnections: Int = 64

    @Option(help: "Most connections open at once from one IP address (a browser opens about 6). Default: 16.")
    var maxConnectionsPerSource: Int = 16

    @Option(
        help: """
            A connection's first request head must be complete this long after it is accepted (TLS handshake \
            included), however slowly it trickles; a later request's within 30 s of the last answer. Then the \
            connection is closed. Default: 10s.
            """
    )
    var requestHeadTimeout: String = "10s"

    @Option(
        help: "A request's body must be complete this long after its head; then the connection is closed. Default: 10s."
    )
    var requestBodyTimeout: String = "10s"

    @OptionGroup var logOptions: LogOptions

    func run() async throws {
        let address = try HostPort(parsing: listen)
        var configuration = ConsoleConfiguration(
            host: address.host,
            port: address.port,
            tlsCertificatePath: tlsCertificate,
            tlsKeyPath: tlsKey,
            allowedHosts: allowedHosts
        )
        configuration.maximumConnections = maxConnections
        configuration.maximumConnectionsPerSource = maxConnectionsPerSource
        configuration.deadlines.firstHead = try Self.duration(requestHeadTimeout, flag: "--request-head-timeout")
        configuration.deadlines.body = try Self.duration(requestBodyTimeout, flag: "--request-body-timeout")
        try configuration.validate()
        let path = identityOption.identity ?? admin.identity ?? AdminCommand.defaultIdentity
        let calls = try AdminCalls(path: path)
        let logger = try logOptions.bootstrap(
            label: "ils-console",
            layers: ConfigLayers(file: nil, environment: { _ in nil })
        )
        let server = try ConsoleServer(configuration: configuration, calls: calls, logger: logger)
        try await server.run { url in
            sayToStandardError("console for \(calls.actor): open \(url) (one use, 10 minutes)")
        }
    }

    private static func duration(_ text: String, flag: String) throws(ILSError) -> TimeAmount {
        let span = try TimeSpan(parsing: text)
        guard span.nanoseconds > 0 else { throw ILSError(.invalidArgument, "\(flag) must be longer than 0") }
        return .nanoseconds(span.nanoseconds)
    }
}
