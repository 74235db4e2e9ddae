/// A `HOST:PORT` pair as written on the command line: `127.0.0.1:8443`, `[::1]:8443`, `localhost:0`.
///
/// Port 0 asks the system for a free port; servers log the port they actually bound.
public struct HostPort: Hashable, Sendable, CustomStringConvertible {
    public let host: String
    public let port: Int

    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    public init(parsing text: String) throws(ILSError) {
        let invalid = ILSError(.invalidArgument, "'\(text)' is not HOST:PORT, e.g. 127.0.0.1:8443 or [::1]:8443")
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else { throw invalid }
            host = text[text.index(after: text.startIndex)..<close]
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { throw invalid }
            portText = rest.dropFirst()
        } else {
            guard let colon = text.lastIndex(of: ":") else { throw invalid }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
            guard !host.contains(":") else { throw invalid }
        }
        guard !host.isEmpty, portText.allSatisfy({ $0.isASCII && $0.isNumber }), portText.count <= 5,
            let port = Int(portText), port <= 65535
        else { throw invalid }
        self.init(host: String(host), port: port)
    }

    /// Whether the host is a loopback address or name, reachable only from this machine.
    public var isLoopback: Bool {
        host == "localhost" || host == "::1" || host.hasPrefix("127.")
    }

    public var description: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}
