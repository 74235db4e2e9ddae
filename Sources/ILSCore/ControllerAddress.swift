/// The controller's public URL, `https://HOST:PORT`: what devices dial and what tokens name as `iss`.
public struct ControllerAddress: Sendable, Hashable, CustomStringConvertible {
    public let host: String
    public let port: Int

    public init(parsing text: String) throws(ILSError) {
        let invalid = ILSError(.invalidArgument, "controller address '\(text)' must look like https://HOST:PORT")
        guard text.hasPrefix("https://") else { throw invalid }
        var authority = Substring(text.dropFirst("https://".count))
        if authority.hasSuffix("/") { authority = authority.dropLast() }
        guard !authority.contains("/"), !authority.contains("@"), !authority.contains("?") else { throw invalid }
        let hostPort: HostPort
        do {
            hostPort = try HostPort(parsing: String(authority))
        } catch {
            throw invalid
        }
        guard hostPort.port > 0 else { throw invalid }
        host = hostPort.host
        port = hostPort.port
    }

    public var description: String {
        host.contains(":") ? "https://[\(host)]:\(port)" : "https://\(host):\(port)"
    }
}
