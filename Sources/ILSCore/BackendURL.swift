/// Where the gateway forwards requests: `http://HOST[:PORT]`, the backend next to the gateway.
///
/// Only cleartext HTTP/1.1 is spoken to the backend, because the backend runs on the same host or the same private
/// network as the gateway (the design's "backend host"); TLS ends at the gateway. A path in the URL is refused rather
/// than silently ignored, so nobody believes requests are being prefixed when they are not.
public struct BackendURL: Hashable, Sendable, CustomStringConvertible {
    public let host: String
    public let port: Int
    /// `HOST:PORT` as it appears in a `Host` header (RFC 9110 §7.2). Stored, not computed: HTTP mode sends it as the
    /// `Host` of every HTTP/1.0 request that has none, and building it per request was one allocation each.
    public let authority: String

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
        self.authority = host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    public init(parsing text: String) throws(ILSError) {
        guard text.hasPrefix("http://") else {
            throw ILSError(
                .invalidArgument,
                "backend URL '\(text)' must start with http:// (the gateway speaks cleartext HTTP/1.1 to a local backend)"
            )
        }
        var authority = Substring(text.dropFirst("http://".count))
        if authority.hasSuffix("/") { authority = authority.dropLast() }
        guard !authority.contains("/"), !authority.contains("?"), !authority.contains("@") else {
            throw ILSError(.invalidArgument, "backend URL '\(text)' must be just http://HOST[:PORT], with no path")
        }
        let hasPort: Bool
        if authority.hasPrefix("[") {
            hasPort = authority.contains("]:")
        } else {
            hasPort = authority.contains(":")
        }
        let hostPort: HostPort
        do {
            hostPort = try HostPort(parsing: hasPort ? String(authority) : "\(authority):80")
        } catch {
            throw ILSError(.invalidArgument, "backend URL '\(text)' is not http://HOST[:PORT]")
        }
        self.init(host: hostPort.host, port: hostPort.port)
    }

    /// The default backend: the FastAPI Claude Code backend on its usual port.
    public static let defaultBackend = BackendURL(host: "127.0.0.1", port: 8000)

    public var description: String { "http://\(authority)" }
}
