public import ILSCore
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

    public var listen: HostPort
    /// `nil` serves cleartext HTTP, which the CLI allows only with an explicit `--plain-http`.
    public var tls: TLSFiles?
    public var proxy: ProxyConfiguration
    /// On shutdown, how long in-flight requests (a long SSE answer, say) may run before they are cut.
    public var drainTimeout: TimeSpan = .seconds(30)

    public static let defaultListen = HostPort(host: "0.0.0.0", port: 8443)

    public init(listen: HostPort, tls: TLSFiles?, proxy: ProxyConfiguration) {
        self.listen = listen
        self.tls = tls
        self.proxy = proxy
    }
}
