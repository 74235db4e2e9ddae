/// The keys one role's config file may hold. A file is checked against exactly one schema, so a key that belongs to
/// another role (`backend` in a tunnel's file) is refused as unknown rather than silently ignored.
public struct ConfigSchema: Sendable {
    /// The command the file configures, as a person types it (`serve`, `tunnel`, `controller run`).
    public let command: String
    public let keys: [ConfigKey]

    public init(command: String, keys: [ConfigKey]) {
        self.command = command
        self.keys = keys
    }

    public func key(named name: String) -> ConfigKey? {
        keys.first { $0.name == name }
    }
}

extension ConfigKey {
    public static let logLevel = ConfigKey("log-level")
    public static let logFormat = ConfigKey("log-format")
    public static let metrics = ConfigKey("metrics", environment: "ILS_METRICS")
    public static let metricsAllowRemote = ConfigKey("metrics-allow-remote", .boolean)
    public static let identity = ConfigKey("identity", environment: "ILS_IDENTITY")
    public static let service = ConfigKey("service", environment: "ILS_SERVICE")
    public static let listen = ConfigKey("listen", environment: "ILS_LISTEN")
    public static let stateDir = ConfigKey("state-dir", environment: "ILS_STATE_DIR")
    public static let store = ConfigKey("store", environment: "ILS_STORE")
    public static let mode = ConfigKey("mode", environment: "NETWORKING_MODE")
    public static let backend = ConfigKey("backend", environment: "BACKEND_URL")
    public static let tlsCert = ConfigKey("tls-cert", environment: "ILS_TLS_CERT")
    public static let tlsKey = ConfigKey("tls-key", environment: "ILS_TLS_KEY")
    public static let plainHTTP = ConfigKey("plain-http", .boolean)
    public static let backendHeaderTimeout = ConfigKey("backend-header-timeout")
    public static let backendConnectTimeout = ConfigKey("backend-connect-timeout")
    public static let backendMaxConnections = ConfigKey("backend-max-connections", .integer)
    public static let idleTimeout = ConfigKey("idle-timeout")
    public static let clientStallTimeout = ConfigKey("client-stall-timeout")
    public static let drainTimeout = ConfigKey("drain-timeout")
    public static let allowRemote = ConfigKey("allow-remote", .boolean)
    /// Comma-separated lists (`ConfigLayers.list`).
    public static let allowedHosts = ConfigKey("allowed-hosts", environment: "ILS_ALLOWED_HOSTS")
    public static let allowOrigins = ConfigKey("allow-origins", environment: "ILS_ALLOW_ORIGINS")
    public static let clientAuth = ConfigKey("client-auth", environment: "ILS_CLIENT_AUTH")
    public static let policyGrace = ConfigKey("policy-grace")
    public static let hstsMaxAge = ConfigKey("hsts-max-age")
    public static let maxConnections = ConfigKey("max-connections", .integer)
    public static let maxConnectionsPerSource = ConfigKey("max-connections-per-source", .integer)
    public static let maxCircuitsPerIdentity = ConfigKey("max-circuits-per-identity", .integer)
    public static let circuitOpensPerSecond = ConfigKey("circuit-opens-per-second", .integer)
    public static let keepalive = ConfigKey("keepalive")
    public static let keepaliveTimeout = ConfigKey("keepalive-timeout")
    public static let requestHeadTimeout = ConfigKey("request-head-timeout")
    public static let requestBodyTimeout = ConfigKey("request-body-timeout")
    public static let auditRetention = ConfigKey("audit-retention")
    public static let auditMaxRows = ConfigKey("audit-max-rows", .integer)
    public static let resumeGrace = ConfigKey("resume-grace")
    public static let resumeBuffer = ConfigKey("resume-buffer")
    public static let resumeTotal = ConfigKey("resume-total")
    public static let resumePerIdentity = ConfigKey("resume-per-identity")
    public static let resumeHeldPerIdentity = ConfigKey("resume-held-per-identity", .integer)
}

extension ConfigSchema {
    private static let observability: [ConfigKey] = [.logLevel, .logFormat, .metrics, .metricsAllowRemote]
    private static let connectionLimits: [ConfigKey] = [.maxConnections, .maxConnectionsPerSource]
    private static let keepalives: [ConfigKey] = [.keepalive, .keepaliveTimeout]

    /// `ils-gateway controller run`.
    public static let controllerRun = ConfigSchema(
        command: "controller run",
        keys: [.stateDir, .store, .listen] + connectionLimits + [.maxCircuitsPerIdentity, .circuitOpensPerSecond]
            + [.requestHeadTimeout, .requestBodyTimeout]
            + [.auditRetention, .auditMaxRows] + keepalives + observability
    )

    /// `ils-gateway serve`, both modes in one file (`mode` picks one; keys of the other mode are ignored by it).
    public static let serve = ConfigSchema(
        command: "serve",
        keys: [
            .mode, .backend, .identity, .service, .listen, .tlsCert, .tlsKey, .plainHTTP, .backendHeaderTimeout,
            .backendConnectTimeout, .backendMaxConnections, .idleTimeout, .clientStallTimeout, .drainTimeout,
            .clientAuth, .policyGrace, .hstsMaxAge, .resumeGrace, .resumeBuffer, .resumeTotal,
            .resumePerIdentity, .resumeHeldPerIdentity,
        ] + connectionLimits + keepalives + observability
    )

    /// `ils-gateway tunnel`.
    public static let tunnel = ConfigSchema(
        command: "tunnel",
        keys: [
            .identity, .service, .listen, .allowRemote, .allowedHosts, .allowOrigins, .resumeGrace, .idleTimeout,
        ] + keepalives
            + observability
    )
}
