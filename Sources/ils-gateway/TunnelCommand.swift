import ArgumentParser
import ILSConfig
import ILSCore
import ILSFabric
import ILSIdentity
import ILSTunnel

/// `ils-gateway tunnel`: a loopback proxy on the device for clients that don't speak the overlay.
struct TunnelCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tunnel",
        abstract: "Listen on loopback and carry every connection to a service through the overlay.",
        discussion: """
            Every TCP connection accepted on --listen becomes an end-to-end encrypted circuit to --service, checked by
            the gateway against this device's identity. Point a client at http://127.0.0.1:PORT.

            The tunnel serves this device's programs, not the web pages its browser shows: a request whose Host is not
            a loopback name, the listen address or the service's name gets 421 (DNS rebinding), and a browser's
            request from another site (Origin, Sec-Fetch-Site) gets 403, before anything reaches the circuit.
            --allowed-host and --allow-origin let one more name or web origin in.

            Each setting comes from its flag, else its environment variable, else the --config file, else the default.

            Examples:
              ils-gateway tunnel --identity identities/ipad.json --listen 127.0.0.1:8080
              curl -N http://127.0.0.1:8080/claude/stream?prompt=hello
              ils-gateway tunnel --config ~/.config/ils-gateway/tunnel.yaml
            """
    )

    @Option(help: "The device's identity file. Env: ILS_IDENTITY. Default: identities/device.json.")
    var identity: String?

    @Option(help: "The service to reach. Env: ILS_SERVICE. Default: claude-api.")
    var service: String?

    @Option(help: "HOST:PORT to listen on. Env: ILS_LISTEN. Default: 127.0.0.1:8080.")
    var listen: String?

    @Flag(
        inversion: .prefixedNo,
        help: "Allow a non-loopback --listen address (anyone who reaches it acts as this device). Default: off."
    )
    var allowRemote: Bool?

    @Option(
        name: .customLong("allowed-host"),
        help: ArgumentHelp(
            "Also answer requests addressed to this Host (name, or name:port). Repeat for several. Env/config: "
                + "ILS_ALLOWED_HOSTS / allowed-hosts, comma-separated.",
            valueName: "name"
        )
    )
    var allowedHosts: [String] = []

    @Option(
        name: .customLong("allow-origin"),
        help: ArgumentHelp(
            "Let web pages of this origin (http://localhost:3000) send requests. Repeat for several. Env/config: "
                + "ILS_ALLOW_ORIGINS / allow-origins, comma-separated. Default: none.",
            valueName: "origin"
        )
    )
    var allowedOrigins: [String] = []

    @Option(
        help: """
            How long a circuit whose network path is lost (a network change, a dead controller) keeps trying to \
            resume; its client sees a pause. 0 ends it with its path, as before resumption, and offers the gateway \
            no resumable circuit (nothing kept, no acknowledgements). Default: 60s.
            """
    )
    var resumeGrace: String?

    @Option(
        help: """
            With no circuit open, the controller connection sends no keepalive PING, and after this long it is \
            closed: an idle tunnel sends nothing at all, and its next request connects again (about two round trips \
            more). 0 keeps it open (still without PINGs). Default: 15s.
            """
    )
    var idleTimeout: String?

    @OptionGroup var keepaliveOptions: KeepaliveOptions
    @OptionGroup var configOptions: ConfigOptions
    @OptionGroup var logOptions: LogOptions
    @OptionGroup var metricsOptions: MetricsOptions

    func run() async throws {
        let layers = try configOptions.layers(.tunnel)
        let path = layers.string(.identity, flag: identity) ?? "identities/device.json"
        let address = try HostPort(parsing: layers.string(.listen, flag: listen) ?? "127.0.0.1:8080")
        let service = layers.string(.service, flag: service) ?? "claude-api"
        let logger = try logOptions.bootstrap(label: "ils-tunnel", layers: layers)
        let file = try await Renewal.renewIfDue(path: path)
        let metrics = try metricsOptions.server(logger: logger, layers: layers, ready: { true })
        let tunnel = try Tunnel(
            identity: file,
            identityPath: path,
            service: service,
            listen: address,
            allowRemote: layers.boolean(.allowRemote, flag: allowRemote),
            allowedHosts: layers.list(.allowedHosts, flag: allowedHosts),
            allowedOrigins: layers.list(.allowOrigins, flag: allowedOrigins),
            keepalive: try keepaliveOptions.resolve(layers),
            idle: try KeepaliveOptions.idle(layers, flag: idleTimeout),
            retention: CircuitRetention(grace: try ResumeOptions.grace(layers, flag: resumeGrace)),
            logger: logger
        )
        if let metrics {
            try await runUntilSignalled(tunnel, metrics, logger: logger)
        } else {
            try await runUntilSignalled(tunnel, logger: logger)
        }
    }
}
