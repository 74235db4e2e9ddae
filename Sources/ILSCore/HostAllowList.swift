/// The `Host` names a loopback server answers to, which is what defeats DNS rebinding: a hostile page whose name
/// resolves to 127.0.0.1 reaches the socket, but its requests still carry its own name as `Host`. One rule for every
/// listener a browser could be pointed at (the console, the tunnel): loopback names at any port, the listen address
/// unless it is a wildcard, and the names given with `--allowed-host` (bare, any port; or `name:port`, that port).
public struct HostAllowList: Sendable, Equatable {
    public let listenHost: String
    public let allowedHosts: [String]

    public init(listenHost: String, allowedHosts: [String] = []) {
        self.listenHost = listenHost
        self.allowedHosts = allowedHosts
    }

    /// Whether `authority` (a `Host` value: `name`, `name:port`, `[v6]:port`) names this server.
    public func allows(authority: String?) -> Bool {
        guard let authority, !authority.isEmpty, let host = Self.host(ofAuthority: authority) else { return false }
        return Self.isLoopback(host)
            || (!Self.isWildcard(listenHost) && host == Self.bare(listenHost))
            || allowedHosts.contains { Self.bare($0) == host || $0.lowercased() == authority.lowercased() }
    }

    /// The host of an authority, lowercased, without IPv6 brackets or a trailing dot; nil when it is malformed.
    public static func host(ofAuthority authority: String) -> String? {
        let host: Substring
        if authority.hasPrefix("[") {
            guard let end = authority.firstIndex(of: "]") else { return nil }
            host = authority[...end]
        } else {
            host = authority.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)[0]
        }
        var bare = Self.bare(String(host))
        if bare.hasSuffix(".") { bare.removeLast() }
        return bare.isEmpty ? nil : bare
    }

    /// 0.0.0.0 and ::, which browsers never send as a Host.
    public static func isWildcard(_ host: String) -> Bool {
        ["0.0.0.0", "::"].contains(bare(host))
    }

    /// `host` lowercased and without the brackets of an IPv6 literal.
    public static func bare(_ host: String) -> String {
        let lowered = host.lowercased()
        return lowered.hasPrefix("[") && lowered.hasSuffix("]") ? String(lowered.dropFirst().dropLast()) : lowered
    }

    /// 127.0.0.0/8, ::1, localhost and names under `.localhost` (which browsers resolve to loopback themselves,
    /// never through DNS, so no hostile page can own one).
    public static func isLoopback(_ host: String) -> Bool {
        let bare = bare(host)
        if bare == "localhost" || bare.hasSuffix(".localhost") || bare == "::1" { return true }
        let parts = bare.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }

    /// Refuses an `--allowed-host` value that is not a host name or address (with an optional port).
    public static func validate(allowedHost host: String, flag: String = "--allowed-host") throws(ILSError) {
        guard host.utf8.count <= 253, !host.isEmpty,
            host.unicodeScalars.allSatisfy({
                $0.isASCII && ($0.properties.isAlphabetic || "0123456789.-:[]".unicodeScalars.contains($0))
            })
        else {
            throw ILSError(.invalidArgument, "\(flag) must be a host name or address, not '\(host.prefix(60))'")
        }
    }
}
