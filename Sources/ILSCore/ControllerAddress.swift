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

extension ControllerAddress {
    /// The most controller replicas a list keeps: a controller's list comes over the network, and a device or
    /// gateway dials each entry, so a hostile or broken one must not make it dial without bound.
    public static let maximumReplicas = 16

    /// `addresses` parsed, in order, each once (by its canonical form), unparseable entries left out, at most
    /// `maximumReplicas`.
    /// The header in which a controller names the cluster's controllers, itself first, comma-separated
    /// (`https://a:8443, https://b:8443`): on every API answer to a caller that presented an identity certificate,
    /// and on every circuit answer to a device. Clients persist it (`IdentityFile.learning`), so an identity made
    /// before a replica existed fails over to it after one connection.
    public static let listHeader = "ils-controllers"

    /// A `listHeader` value: the addresses in it that parse (`replicas`: each once, at most `maximumReplicas`).
    public static func list(header value: String) -> [ControllerAddress] {
        replicas(value.split(separator: ",").map { String($0.filter { !$0.isWhitespace }) })
    }

    /// The `listHeader` value for `addresses`.
    public static func header(_ addresses: [String]) -> String { addresses.joined(separator: ", ") }

    public static func replicas(_ addresses: [String]) -> [ControllerAddress] {
        var seen: Set<ControllerAddress> = []
        var list: [ControllerAddress] = []
        for text in addresses where list.count < maximumReplicas {
            guard let address = try? ControllerAddress(parsing: text), seen.insert(address).inserted else { continue }
            list.append(address)
        }
        return list
    }
}
