public import Foundation
public import ILSCore
public import ILSFabric
public import ILSProxy

/// `serve --mode http`: a listening, TLS-terminating reverse proxy for clients that don't speak the overlay.
public struct HTTPModeConfiguration: Sendable {
    /// PEM files for the server's certificate chain and private key.
    public struct TLSFiles: Sendable, Hashable {
        public var certificateChain: String
        public var privateKey: String

        public init(certificateChain: String, privateKey: String) {
            self.certificateChain = certificateChain
            self.privateKey = privateKey
        }
    }

    /// Mutual TLS with the overlay's device identities: who may use the backend, and where revocations come from.
    public struct DeviceAuthentication: Sendable {
        /// The gateway's own enrolled identity: its CA verifies the clients' certificates, and its certificate
        /// authenticates the control link over which the controller sends the service's policy and block list.
        public var identity: IdentityFile
        /// Where `identity` was read from, so the gateway renews its certificate itself before it expires; `nil`
        /// leaves that to `ils-gateway renew` and a restart.
        public var identityPath: String?
        /// How often the certificate is checked for renewal, and the clock it is checked against (tests).
        package var renewalCheck: Duration = .seconds(6 * 3600)
        /// How often the certificates of open client connections are checked with the controller again.
        package var recheckInterval: Duration = .seconds(60)
        package var now: @Sendable () -> Date = { Date() }
        /// The service whose dial policy applies (the controller checks this gateway may host it).
        public var service: String
        /// How long the last policy from the controller stays in force while the control link is down; after that
        /// every request is refused with 503 `policy_unavailable` until the link is back. It bounds how late a
        /// revocation made meanwhile can take effect here, while a controller restart does not stop the service.
        public var policyGrace: TimeSpan = .seconds(60)
        /// How the policy link notices a controller that is gone without a word (a NAT mapping dropped).
        public var keepalive: FabricKeepalive = .standard

        public init(identity: IdentityFile, service: String) {
            self.identity = identity
            self.service = service
        }
    }

    public var listen: HostPort
    /// `nil` serves cleartext HTTP, which the CLI allows only with an explicit `--plain-http`.
    public var tls: TLSFiles?
    public var proxy: ProxyConfiguration
    /// On shutdown, how long in-flight requests (a long SSE answer, say) may run before they are cut.
    public var drainTimeout: TimeSpan = .seconds(30)
    /// Client certificates of active device identities required (TLS only); `nil`: anyone who reaches the port.
    public var devices: DeviceAuthentication?
    /// `Strict-Transport-Security: max-age=…` on every response (TLS only); `nil`: no header.
    public var hstsMaxAge: TimeSpan?

    /// Connections open at once, per client address and in total; beyond them a connection is closed at accept.
    public var connectionLimits: ConnectionLimiter.Limits = Self.defaultConnectionLimits

    public static let defaultListen = HostPort(host: "0.0.0.0", port: 8443)
    /// A browser opens about 6 connections to a host, so 512 per address is some 80 browsers behind one NAT; 16384
    /// in total matches the backend pool's default `--backend-max-connections`.
    public static let defaultConnectionLimits = ConnectionLimiter.Limits(total: 16384, perSource: 512)

    public init(listen: HostPort, tls: TLSFiles?, proxy: ProxyConfiguration) {
        self.listen = listen
        self.tls = tls
        self.proxy = proxy
    }
}
