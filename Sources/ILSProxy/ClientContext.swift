public import ILSCore
public import NIOCore

/// What the proxy core knows about the client side of one connection, whatever carries it: a TCP socket in HTTP
/// mode, an end-to-end encrypted circuit in overlay mode.
public struct ClientContext: Sendable {
    /// The scheme the client used to reach the gateway, reported to the backend in `X-Forwarded-Proto`.
    public enum Scheme: String, Sendable {
        case http
        case https
    }

    public var remoteAddress: SocketAddress? {
        didSet { forwardedFor = Self.render(remoteAddress) }
    }
    public var scheme: Scheme
    /// Set only when the transport verified an enrolled identity; never taken from request headers.
    public var identity: PeerIdentity?

    public init(remoteAddress: SocketAddress?, scheme: Scheme, identity: PeerIdentity? = nil) {
        self.remoteAddress = remoteAddress
        self.scheme = scheme
        self.identity = identity
        self.forwardedFor = Self.render(remoteAddress)
    }

    /// The client's address as it appears in `X-Forwarded-For`: the bare IP, no port. Rendered once per connection,
    /// not per request (`SocketAddress.ipAddress` formats the address anew on every call).
    private(set) var forwardedFor: String

    private static func render(_ address: SocketAddress?) -> String {
        address?.ipAddress ?? "unknown"
    }
}
