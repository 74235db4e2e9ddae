import ArgumentParser
import ILSClient
import ILSCore
import ILSGateway
import ILSProxy
import Logging

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// `ils-gateway serve`: the gateway next to the backend.
struct ServeCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "serve",
        abstract: "Run the gateway in front of the backend.",
        discussion: """
            HTTP mode listens on --listen, terminates TLS and streams every request to the backend, without \
            buffering: Server-Sent Events and any other streamed body reach the client as the backend writes it, \
            and WebSocket upgrades pass through.

            Examples:
              ils-gateway serve --mode http --tls-cert server.pem --tls-key server.key
              ils-gateway serve --mode http --plain-http --listen 127.0.0.1:8080 --backend http://127.0.0.1:9090

            Overlay mode (--mode ziti, the default) opens no listening socket: it dials out to the controller \
            named in the gateway's identity file, hosts --service, and checks every circuit's device end to end \
            before forwarding it to the backend:
              ils-gateway serve --identity identities/gateway.json --backend http://127.0.0.1:8000

            Environment, used when the flag is absent: NETWORKING_MODE, BACKEND_URL, ILS_LISTEN, ILS_TLS_CERT, \
            ILS_TLS_KEY. SIGTERM or SIGINT stops accepting and drains open requests for up to --drain-timeout.
            """
    )

    enum Mode: String, ExpressibleByArgument, CaseIterable {
        case ziti
        case http
    }

    @Option(help: "ziti (overlay, no listening port) or http (TLS reverse proxy). Env: NETWORKING_MODE.")
    var mode: Mode?

    @Option(help: "Overlay mode: the gateway's identity file. Env: ILS_IDENTITY. Default: identities/gateway.json.")
    var identity: String?

    @Option(help: "Overlay mode: the service to host. Env: ILS_SERVICE. Default: claude-api.")
    var service: String?

    @Option(help: "Backend base URL, http://HOST[:PORT]. Env: BACKEND_URL. Default: http://127.0.0.1:8000.")
    var backend: String?

    @Option(help: "HTTP mode: address to listen on, HOST:PORT. Env: ILS_LISTEN. Default: 0.0.0.0:8443.")
    var listen: String?

    @Option(help: "HTTP mode: PEM certificate chain for TLS. Env: ILS_TLS_CERT.")
    var tlsCert: String?

    @Option(help: "HTTP mode: PEM private key for TLS. Env: ILS_TLS_KEY.")
    var tlsKey: String?

    @Flag(help: "HTTP mode: serve cleartext HTTP instead of TLS. Only for a trusted network or loopback.")
    var plainHTTP = false

    @Option(help: "How long the backend may take to send response headers (e.g. 300s). Streams are never cut.")
    var backendHeaderTimeout: String = "300s"

    @Option(help: "How long connecting to the backend may take.")
    var backendConnectTimeout: String = "5s"

    @Option(help: "Most connections open to the backend at once.")
    var backendMaxConnections: Int = 16384

    @Option(help: "How long a client connection may stay open with no request in progress (also bounds slow headers).")
    var idleTimeout: String = "60s"

    @Option(help: "How long a client may read nothing of a response before the exchange is given up.")
    var clientStallTimeout: String = "600s"

    @Option(help: "On SIGTERM/SIGINT, how long in-flight requests may continue before they are closed.")
    var drainTimeout: String = "30s"

    @OptionGroup var logOptions: LogOptions
    @OptionGroup var metricsOptions: MetricsOptions

    func run() async throws {
        let environment = ProcessEnvironment()
        let modeName = mode?.rawValue ?? environment["NETWORKING_MODE"] ?? Mode.ziti.rawValue
        guard let mode = Mode(rawValue: modeName) else {
            throw ILSError(.invalidArgument, "NETWORKING_MODE must be ziti or http, not '\(modeName)'")
        }
        if mode == .ziti {
            try await runOverlay(environment: environment)
            return
        }
        let configuration = try httpConfiguration(environment: environment)
        let logger = logOptions.bootstrap(label: "ils-gateway")
        let metrics = try metricsOptions.server(logger: logger, ready: { true })
        let server = try HTTPModeServer(configuration: configuration, logger: logger)
        if let metrics {
            try await runUntilSignalled(server, metrics, logger: logger)
        } else {
            try await runUntilSignalled(server, logger: logger)
        }
    }

    private func runOverlay(environment: ProcessEnvironment) async throws {
        let path = identity ?? environment["ILS_IDENTITY"] ?? "identities/gateway.json"
        let file = try await Renewal.renewIfDue(path: path)
        let backendURL = try BackendURL(parsing: backend ?? environment["BACKEND_URL"] ?? "http://127.0.0.1:8000")
        var proxy = ProxyConfiguration(backend: backendURL)
        proxy.backendHeaderTimeout = try positive(backendHeaderTimeout, "--backend-header-timeout")
        proxy.backendConnectTimeout = try positive(backendConnectTimeout, "--backend-connect-timeout")
        proxy.clientIdleTimeout = try positive(idleTimeout, "--idle-timeout")
        proxy.clientStallTimeout = try positive(clientStallTimeout, "--client-stall-timeout")
        proxy.backendMaxConnections = backendMaxConnections
        let logger = logOptions.bootstrap(label: "ils-gateway")
        let holder = GatewayHolder()
        let metrics = try metricsOptions.server(logger: logger, ready: { holder.gateway?.isHosting ?? false })
        let gateway = try OverlayGateway(
            identity: file,
            identityPath: path,
            service: service ?? environment["ILS_SERVICE"] ?? "claude-api",
            proxy: proxy,
            logger: logger
        )
        logger.info(
            "serving overlay mode (no listening socket)",
            metadata: [
                "identity": "\(file.identity.name)", "backend": "\(backendURL)",
            ]
        )
        holder.gateway = gateway
        if let metrics {
            try await runUntilSignalled(gateway, metrics, logger: logger)
        } else {
            try await runUntilSignalled(gateway, logger: logger)
        }
    }

    private func httpConfiguration(environment: ProcessEnvironment) throws(ILSError) -> HTTPModeConfiguration {
        let backendURL = try BackendURL(parsing: backend ?? environment["BACKEND_URL"] ?? "http://127.0.0.1:8000")
        let listenAddress: HostPort
        if let text = listen ?? environment["ILS_LISTEN"] {
            listenAddress = try HostPort(parsing: text)
        } else {
            listenAddress = HTTPModeConfiguration.defaultListen
        }
        let certificate = tlsCert ?? environment["ILS_TLS_CERT"]
        let key = tlsKey ?? environment["ILS_TLS_KEY"]
        let tls: HTTPModeConfiguration.TLSFiles?
        switch (certificate, key, plainHTTP) {
        case (let certificate?, let key?, false):
            tls = .init(certificateChain: certificate, privateKey: key)
        case (nil, nil, true):
            tls = nil
        case (_, _, true):
            throw ILSError(.invalidArgument, "--plain-http cannot be combined with --tls-cert or --tls-key")
        case (nil, nil, false):
            throw ILSError(
                .invalidArgument,
                "HTTP mode needs --tls-cert and --tls-key, or --plain-http to serve cleartext on a trusted network"
            )
        default:
            throw ILSError(.invalidArgument, "give both --tls-cert and --tls-key")
        }
        guard backendMaxConnections > 0 else {
            throw ILSError(.invalidArgument, "--backend-max-connections must be at least 1")
        }
        var proxy = ProxyConfiguration(backend: backendURL)
        proxy.backendHeaderTimeout = try positive(backendHeaderTimeout, "--backend-header-timeout")
        proxy.backendConnectTimeout = try positive(backendConnectTimeout, "--backend-connect-timeout")
        proxy.clientIdleTimeout = try positive(idleTimeout, "--idle-timeout")
        proxy.clientStallTimeout = try positive(clientStallTimeout, "--client-stall-timeout")
        proxy.backendMaxConnections = backendMaxConnections
        var configuration = HTTPModeConfiguration(listen: listenAddress, tls: tls, proxy: proxy)
        configuration.drainTimeout = try TimeSpan(parsing: drainTimeout)
        return configuration
    }

    private func positive(_ text: String, _ flag: String) throws(ILSError) -> TimeSpan {
        let span = try TimeSpan(parsing: text)
        guard span.nanoseconds > 0 else { throw ILSError(.invalidArgument, "\(flag) must be longer than 0") }
        return span
    }
}

/// The process environment, read once.
struct ProcessEnvironment {
    subscript(name: String) -> String? {
        guard let value = getenv(name) else { return nil }
        let text = String(cString: value)
        return text.isEmpty ? nil : text
    }
}

/// Lets the readiness probe see the gateway created after it.
final class GatewayHolder: @unchecked Sendable {
    // @unchecked: written once before the services start, read afterwards.
    var gateway: OverlayGateway?
}
