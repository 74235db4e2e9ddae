public import ILSCore

/// Where the console listens and who may address it. Loopback by default; any other address needs TLS, so a
/// session cookie or a login link never crosses a network in the clear.
public struct ConsoleConfiguration: Sendable {
    public var host: String
    public var port: Int
    /// PEM paths of the certificate and key to serve HTTPS with.
    public var tlsCertificatePath: String?
    public var tlsKeyPath: String?
    /// `Host` values accepted besides loopback ones (the name the console is hosted as in the overlay, say): any
    /// other is refused with 421, which is what stops DNS rebinding.
    public var allowedHosts: [String]
    /// How long a client may take over what it sends (`ConsoleDeadlines`).
    public var deadlines = ConsoleDeadlines()
    /// Connections open at once, all clients together and from one address. A console serves a few admins' browsers
    /// (six connections each at most); the caps bound what a client that opens many can hold.
    public var maximumConnections = 64
    public var maximumConnectionsPerSource = 16

    public init(
        host: String = "127.0.0.1",
        port: Int = 8090,
        tlsCertificatePath: String? = nil,
        tlsKeyPath: String? = nil,
        allowedHosts: [String] = []
    ) {
        self.host = host
        self.port = port
        self.tlsCertificatePath = tlsCertificatePath
        self.tlsKeyPath = tlsKeyPath
        self.allowedHosts = allowedHosts
    }

    public var usesTLS: Bool { tlsCertificatePath != nil }

    /// `http` or `https`.
    public var scheme: String { usesTLS ? "https" : "http" }

    /// The session cookie's name: `__Host-` under TLS (the browser then insists on Secure, Path=/ and no Domain).
    public var cookieName: String { usesTLS ? "__Host-ils_console" : "ils_console" }

    /// Refuses what must not run: half a TLS pair, a bad allowed host, and a non-loopback address without TLS.
    public func validate() throws(ILSError) {
        guard (tlsCertificatePath == nil) == (tlsKeyPath == nil) else {
            throw ILSError(.invalidArgument, "--tls-cert and --tls-key go together")
        }
        guard (0...65535).contains(port) else {
            throw ILSError(.invalidArgument, "the port must be between 0 and 65535")
        }
        guard maximumConnections > 0 else { throw ILSError(.invalidArgument, "--max-connections must be at least 1") }
        guard maximumConnectionsPerSource > 0 else {
            throw ILSError(.invalidArgument, "--max-connections-per-source must be at least 1")
        }
        for (flag, amount) in [
            ("--request-head-timeout", deadlines.firstHead), ("--request-body-timeout", deadlines.body),
            ("the idle timeout", deadlines.idle), ("the unread-answer timeout", deadlines.unread),
        ] where amount.nanoseconds <= 0 {
            throw ILSError(.invalidArgument, "\(flag) must be longer than 0")
        }
        for host in allowedHosts { try HostAllowList.validate(allowedHost: host) }
        guard !Self.isWildcard(host) || allowedHosts.first != nil || !usesTLS else {
            throw ILSError(
                .invalidArgument,
                "listening on every address (\(host)), the console needs --allowed-host NAME: the name browsers reach it "
                    + "by (any other Host is refused)"
            )
        }
        guard usesTLS || Self.isLoopback(host) else {
            throw ILSError(
                .invalidArgument,
                "the console listens beyond loopback (\(host)) only with TLS: give --tls-cert and --tls-key, or "
                    + "listen on 127.0.0.1 and reach it through the overlay or an SSH tunnel"
            )
        }
    }

    /// 0.0.0.0 and ::, which browsers never send as a Host.
    public static func isWildcard(_ host: String) -> Bool { HostAllowList.isWildcard(host) }

    /// The host a login link names: the listen address, or for a wildcard the first allowed host.
    public var linkHost: String {
        let host = Self.isWildcard(host) ? (allowedHosts.first ?? "127.0.0.1") : host
        return host.contains(":") && !host.hasPrefix("[") ? "[\(host)]" : host
    }

    /// 127.0.0.0/8, ::1, localhost and `*.localhost`.
    public static func isLoopback(_ host: String) -> Bool { HostAllowList.isLoopback(host) }

    /// The `Host` names the console answers to.
    public var hostAllowList: HostAllowList { HostAllowList(listenHost: host, allowedHosts: allowedHosts) }
}
