import ArgumentParser
import ILSConfig
import ILSCore
import ILSGateway
import ILSIdentity
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

            With a config file (keys named like the long flags; see deploy/config/gateway.yaml):
              ils-gateway serve --config /etc/ils-gateway/gateway.yaml

            Each setting comes from its flag, else its environment variable (NETWORKING_MODE, BACKEND_URL, \
            ILS_IDENTITY, ILS_SERVICE, ILS_LISTEN, ILS_TLS_CERT, ILS_TLS_KEY), else the --config file, else the \
            default. SIGTERM or SIGINT stops accepting and drains open requests for up to --drain-timeout.
            """
    )

    enum Mode: String, ExpressibleByArgument, CaseIterable {
        case ziti
        case http
    }

    enum ClientAuth: String, ExpressibleByArgument, CaseIterable {
        case required
        case none
    }

    @Option(help: "ziti (overlay, no listening port) or http (TLS reverse proxy). Env: NETWORKING_MODE.")
    var mode: Mode?

    @Option(
        help: """
            The gateway's identity file. Env: ILS_IDENTITY. Overlay mode: default identities/gateway.json. HTTP mode: \
            with one, clients need a certificate of an active device identity from its controller.
            """
    )
    var identity: String?

    @Option(help: "The service to host (HTTP mode: whose dial policy applies). Env: ILS_SERVICE. Default: claude-api.")
    var service: String?

    @Option(
        help: """
            HTTP mode with --identity: 'required' (client certificates of active devices; the default) or 'none' \
            (anyone who reaches the port). Env: ILS_CLIENT_AUTH.
            """
    )
    var clientAuth: ClientAuth?

    @Option(help: "HTTP mode: how long the last policy holds while the controller is unreachable. Default: 60s.")
    var policyGrace: String?

    @Option(help: "HTTP mode over TLS: send Strict-Transport-Security with this max-age (e.g. 365d). Default: off.")
    var hstsMaxAge: String?

    @Option(help: "Backend base URL, http://HOST[:PORT]. Env: BACKEND_URL. Default: http://127.0.0.1:8000.")
    var backend: String?

    @Option(help: "HTTP mode: address to listen on, HOST:PORT. Env: ILS_LISTEN. Default: 0.0.0.0:8443.")
    var listen: String?

    @Option(help: "HTTP mode: PEM certificate chain for TLS. Env: ILS_TLS_CERT.")
    var tlsCert: String?

    @Option(help: "HTTP mode: PEM private key for TLS. Env: ILS_TLS_KEY.")
    var tlsKey: String?

    @Flag(
        inversion: .prefixedNo,
        help: "HTTP mode: serve cleartext HTTP instead of TLS. Only for a trusted network or loopback. Default: off."
    )
    var plainHTTP: Bool?

    @Option(help: "How long the backend may take to send response headers. Streams are never cut. Default: 300s.")
    var backendHeaderTimeout: String?

    @Option(help: "How long connecting to the backend may take. Default: 5s.")
    var backendConnectTimeout: String?

    @Option(help: "Most connections open to the backend at once. Default: 16384.")
    var backendMaxConnections: Int?

    @Option(
        help:
            "How long a client connection may stay open with no request in progress (also bounds slow headers). Default: 60s."
    )
    var idleTimeout: String?

    @Option(
        help: """
            How long a client may take nothing of a response before the exchange is given up with its backend \
            request. Overlay mode: a device that acknowledges nothing of a circuit's answer (reads nothing, on a \
            circuit that cannot resume). Default: 60s in overlay mode, the grace window's length (a device that is \
            there but takes nothing gets no longer than one that is gone); 600s in HTTP mode.
            """
    )
    var clientStallTimeout: String?

    @Option(help: "On SIGTERM/SIGINT, how long in-flight requests may continue before they are closed. Default: 30s.")
    var drainTimeout: String?

    @OptionGroup var connectionLimitOptions: HTTPConnectionLimitOptions
    @OptionGroup var keepaliveOptions: KeepaliveOptions
    @OptionGroup var resumeOptions: ResumeOptions
    @OptionGroup var configOptions: ConfigOptions
    @OptionGroup var logOptions: LogOptions
    @OptionGroup var metricsOptions: MetricsOptions

    func run() async throws {
        let layers = try configOptions.layers(.serve)
        let mode = try layers.parsed(.mode, flag: mode) { Mode(rawValue: $0) } ?? .ziti
        if mode == .ziti {
            try await runOverlay(layers: layers)
            return
        }
        var configuration = try httpConfiguration(layers: layers)
        let logger = try logOptions.bootstrap(label: "ils-gateway", layers: layers)
        configuration.proxy.accessLog = try logOptions.accessLog(label: logger.label, layers: layers)
        configuration.devices = try await deviceAuthentication(layers: layers, tls: configuration.tls != nil, logger)
        let server = try HTTPModeServer(configuration: configuration, logger: logger)
        let metrics = try metricsOptions.server(logger: logger, layers: layers, ready: { server.isReady })
        if let metrics {
            try await runUntilSignalled(server, metrics, logger: logger)
        } else {
            try await runUntilSignalled(server, logger: logger)
        }
    }

    private func runOverlay(layers: ConfigLayers) async throws {
        let path = layers.string(.identity, flag: identity) ?? "identities/gateway.json"
        var proxy = try proxyConfiguration(layers: layers, stallDefault: Self.circuitStallDefault)
        let service = layers.string(.service, flag: service) ?? "claude-api"
        // Every option is checked before a file is read: a bad value is refused as such, identity or not.
        let keepalive = try keepaliveOptions.resolve(layers)
        let retention = try resumeOptions.resolve(layers)
        let logger = try logOptions.bootstrap(label: "ils-gateway", layers: layers)
        proxy.accessLog = try logOptions.accessLog(label: logger.label, layers: layers)
        let file = try await Renewal.renewIfDue(path: path)
        let holder = GatewayHolder()
        let metrics = try metricsOptions.server(
            logger: logger,
            layers: layers,
            ready: { holder.gateway?.isHosting ?? false },
            beforeScrape: { holder.gateway?.recordHeldGauges() }
        )
        let gateway = try OverlayGateway(
            identity: file,
            identityPath: path,
            service: service,
            proxy: proxy,
            logger: logger,
            keepalive: keepalive,
            retention: retention,
            releaseMemory: { MemoryTuning.trim() }
        )
        logger.info(
            "serving overlay mode (no listening socket)",
            metadata: [
                "identity": "\(file.identity.name)", "backend": "\(proxy.backend)",
                "client_stall_timeout": "\(proxy.clientStallTimeout)",
            ]
        )
        holder.gateway = gateway
        if let metrics {
            try await runUntilSignalled(gateway, metrics, logger: logger)
        } else {
            try await runUntilSignalled(gateway, logger: logger)
        }
    }

    /// A circuit whose device takes nothing (a resumable one: acknowledges nothing, so it stays at its bound) is given
    /// up after 60 s, as long as a device that is gone is held (`CircuitRetention.defaultGrace`): with HTTP mode's 10
    /// minutes one device's stalled circuits kept their bounds (32 MiB for the identity, beyond 640 KiB each) that long
    /// (issue 49). A slow link is not a stall: anything acknowledged starts the time again.
    static let circuitStallDefault = "60s"

    private func proxyConfiguration(
        layers: ConfigLayers,
        stallDefault: String = "600s"
    ) throws(ILSError) -> ProxyConfiguration {
        let backendURL = try BackendURL(parsing: layers.string(.backend, flag: backend) ?? "http://127.0.0.1:8000")
        let maxConnections = layers.integer(.backendMaxConnections, flag: backendMaxConnections) ?? 16384
        guard maxConnections > 0 else {
            throw ILSError(.invalidArgument, "--backend-max-connections must be at least 1")
        }
        var proxy = ProxyConfiguration(backend: backendURL)
        proxy.backendHeaderTimeout = try positive(.backendHeaderTimeout, backendHeaderTimeout, "300s", layers)
        proxy.backendConnectTimeout = try positive(.backendConnectTimeout, backendConnectTimeout, "5s", layers)
        proxy.clientIdleTimeout = try positive(.idleTimeout, idleTimeout, "60s", layers)
        proxy.clientStallTimeout = try positive(.clientStallTimeout, clientStallTimeout, stallDefault, layers)
        proxy.backendMaxConnections = maxConnections
        return proxy
    }

    private func httpConfiguration(layers: ConfigLayers) throws(ILSError) -> HTTPModeConfiguration {
        let listenAddress: HostPort
        if let text = layers.string(.listen, flag: listen) {
            listenAddress = try HostPort(parsing: text)
        } else {
            listenAddress = HTTPModeConfiguration.defaultListen
        }
        let certificate = layers.string(.tlsCert, flag: tlsCert)
        let key = layers.string(.tlsKey, flag: tlsKey)
        let tls: HTTPModeConfiguration.TLSFiles?
        switch (certificate, key, layers.boolean(.plainHTTP, flag: plainHTTP)) {
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
        let proxy = try proxyConfiguration(layers: layers)
        var configuration = HTTPModeConfiguration(listen: listenAddress, tls: tls, proxy: proxy)
        configuration.drainTimeout = try TimeSpan(parsing: layers.string(.drainTimeout, flag: drainTimeout) ?? "30s")
        if let text = layers.string(.hstsMaxAge, flag: hstsMaxAge) {
            guard tls != nil else {
                throw ILSError(.invalidArgument, "--hsts-max-age needs TLS: browsers ignore the header over plain HTTP")
            }
            // 0 is allowed: it tells browsers to forget an earlier policy (RFC 6797 §6.1.1).
            configuration.hstsMaxAge = try TimeSpan(parsing: text)
        }
        configuration.connectionLimits = try .resolve(
            total: connectionLimitOptions.maxConnections,
            perSource: connectionLimitOptions.maxConnectionsPerSource,
            layers: layers,
            defaults: HTTPModeConfiguration.defaultConnectionLimits
        )
        return configuration
    }

    /// HTTP mode's client authentication: with a gateway identity, client certificates of active devices from its
    /// controller (the default); without one, or with `--client-auth none`, anyone who reaches the port, which is
    /// said at startup as a warning.
    private func deviceAuthentication(
        layers: ConfigLayers,
        tls: Bool,
        _ logger: Logger
    ) async throws -> HTTPModeConfiguration.DeviceAuthentication? {
        let path = layers.string(.identity, flag: identity)
        let mode = try layers.parsed(.clientAuth, flag: clientAuth) { ClientAuth(rawValue: $0) }
        switch (path, mode) {
        case (nil, .required):
            throw ILSError(
                .invalidArgument,
                "--client-auth required needs --identity: the gateway identity whose controller issues the devices'"
                    + " certificates"
            )
        case (nil, _):
            logger.warning(
                "no client certificates: anyone who reaches the port uses the backend (--identity admits devices only)"
            )
            return nil
        case (_, ClientAuth.none?):
            logger.warning("--client-auth none: no client certificates, anyone who reaches the port uses the backend")
            return nil
        case (let path?, _):
            guard tls else {
                throw ILSError(.invalidArgument, "client certificates need TLS: --identity cannot go with --plain-http")
            }
            let file = try await Renewal.renewIfDue(path: path)
            var devices = HTTPModeConfiguration.DeviceAuthentication(
                identity: file,
                service: layers.string(.service, flag: service) ?? "claude-api"
            )
            devices.identityPath = path
            devices.policyGrace = try positive(.policyGrace, policyGrace, "60s", layers)
            devices.keepalive = try keepaliveOptions.resolve(layers)
            logger.info(
                "clients need an active device identity's certificate",
                metadata: ["identity": "\(file.identity.name)", "controller": "\(file.controller)"]
            )
            return devices
        }
    }

    /// A timeout from its flag, the file or `fallback`, which must be longer than zero.
    private func positive(
        _ key: ConfigKey,
        _ flag: String?,
        _ fallback: String,
        _ layers: ConfigLayers
    ) throws(ILSError) -> TimeSpan {
        let span = try TimeSpan(parsing: layers.string(key, flag: flag) ?? fallback)
        guard span.nanoseconds > 0 else { throw ILSError(.invalidArgument, "\(key.flag) must be longer than 0") }
        return span
    }
}

/// The process environment, read once.
struct ProcessEnvironment: Sendable {
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
