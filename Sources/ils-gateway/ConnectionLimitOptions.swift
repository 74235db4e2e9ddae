import ArgumentParser
import ILSConfig
import ILSController
import ILSCore
import ILSFabric
import NIOCore

/// `--max-connections` and `--max-connections-per-source` of `serve --mode http`. `controller run` has the same two
/// flags with its own defaults (`ControllerConnectionOptions`); both resolve through `ConnectionLimiter.Limits.resolve`.
struct HTTPConnectionLimitOptions: ParsableArguments {
    @Option(
        help: """
            HTTP mode: most client connections open at once; beyond it a new connection is closed as it is \
            accepted, before TLS, and counted in ils_connections_refused_total. Default: 16384.
            """
    )
    var maxConnections: Int?

    @Option(
        help: """
            HTTP mode: most connections open at once from one client IP address (a browser opens about 6; raise it \
            for many clients behind one NAT). Refused like --max-connections, logged once per address per minute. \
            Default: 512.
            """
    )
    var maxConnectionsPerSource: Int?
}

extension ConnectionLimiter.Limits {
    /// The caps from their flags, else the config file, else `defaults`; each must be at least 1.
    static func resolve(
        total: Int?,
        perSource: Int?,
        layers: ConfigLayers,
        defaults: ConnectionLimiter.Limits
    ) throws(ILSError) -> ConnectionLimiter.Limits {
        let limits = ConnectionLimiter.Limits(
            total: layers.integer(.maxConnections, flag: total) ?? defaults.total,
            perSource: layers.integer(.maxConnectionsPerSource, flag: perSource) ?? defaults.perSource
        )
        guard limits.total > 0 else { throw ILSError(.invalidArgument, "--max-connections must be at least 1") }
        guard limits.perSource > 0 else {
            throw ILSError(.invalidArgument, "--max-connections-per-source must be at least 1")
        }
        return limits
    }
}

/// `controller run`'s caps and API request deadlines.
struct ControllerConnectionOptions: ParsableArguments {
    @Option(
        help: """
            Most connections open at once on the port (API calls, devices, and each gateway's one link per \
            controller event loop); beyond it a new connection is closed as it is accepted, before TLS, and counted \
            in ils_connections_refused_total. Default: 4096.
            """
    )
    var maxConnections: Int?

    @Option(
        help: """
            Most connections open at once from one IP address (a gateway host holds one per controller event loop \
            per gateway; devices behind one NAT share an address). Refused like --max-connections, logged once per \
            address per minute. Default: 256.
            """
    )
    var maxConnectionsPerSource: Int?

    @Option(
        help: """
            An API request's head must be complete this long after its first byte (the first request's: after the \
            TLS handshake), however slowly it trickles; then 408 and close. Default: 10s.
            """
    )
    var requestHeadTimeout: String?

    @Option(help: "An API request's body must be complete this long after its head; then 408 and close. Default: 20s.")
    var requestBodyTimeout: String?

    @Option(
        help: """
            Most circuits one identity may hold open at once through this controller (all its connections together; \
            devices are also told it as their HTTP/2 stream limit). Beyond it a circuit is answered 429 \
            circuit_limit, counted in ils_refusals_total{reason} and logged once per identity per minute. \
            Default: 256.
            """
    )
    var maxCircuitsPerIdentity: Int?

    @Option(
        help: """
            Most new circuits one identity may open per second through this controller, sustained (twice as many \
            at once after a quiet spell); beyond it 429 circuit_rate. Default: 200.
            """
    )
    var circuitOpensPerSecond: Int?

    func circuitLimits(_ layers: ConfigLayers) throws(ILSError) -> CircuitLimiter.Limits {
        let defaults = CircuitLimiter.Limits.standard
        let concurrent = layers.integer(.maxCircuitsPerIdentity, flag: maxCircuitsPerIdentity) ?? defaults.concurrent
        let rate = layers.integer(.circuitOpensPerSecond, flag: circuitOpensPerSecond) ?? defaults.opensPerSecond
        guard concurrent > 0, concurrent <= FabricSettings.maximumConcurrentStreams else {
            throw ILSError(
                .invalidArgument,
                "--max-circuits-per-identity must be between 1 and \(FabricSettings.maximumConcurrentStreams)"
            )
        }
        guard rate > 0 else { throw ILSError(.invalidArgument, "--circuit-opens-per-second must be at least 1") }
        return CircuitLimiter.Limits(concurrent: concurrent, opensPerSecond: rate)
    }

    func limits(_ layers: ConfigLayers) throws(ILSError) -> ConnectionLimiter.Limits {
        try .resolve(
            total: maxConnections,
            perSource: maxConnectionsPerSource,
            layers: layers,
            defaults: ControllerServer.defaultConnectionLimits
        )
    }

    func requestTimeouts(_ layers: ConfigLayers) throws(ILSError) -> APIRequestDeadlines.Timeouts {
        var timeouts = ControllerServer.defaultRequestTimeouts
        let settings: [(ConfigKey, String?, WritableKeyPath<APIRequestDeadlines.Timeouts, TimeAmount>)] = [
            (.requestHeadTimeout, requestHeadTimeout, \.head),
            (.requestBodyTimeout, requestBodyTimeout, \.body),
        ]
        for (key, flag, path) in settings {
            guard let text = layers.string(key, flag: flag) else { continue }
            let span = try TimeSpan(parsing: text)
            guard span.nanoseconds > 0 else { throw ILSError(.invalidArgument, "\(key.flag) must be longer than 0") }
            timeouts[keyPath: path] = .nanoseconds(span.nanoseconds)
        }
        return timeouts
    }
}
