public import ILSCore

/// The message the controller sends a gateway on the control stream after checking its bind permission.
public struct HostControlMessage: Codable, Sendable {
    /// Roles allowed to dial the service; the gateway enforces this itself on every circuit.
    public var dialRoles: [IdentityRole]?
    /// Ids of identities that must not be let in (revoked or disabled), whatever their certificate says: the full
    /// list, sent on every (re)connection and again whenever it changes.
    public var blocked: [String]?
    /// Set instead when the gateway may not host the service.
    public var error: String?

    public init(dialRoles: [IdentityRole]? = nil, blocked: [String]? = nil, error: String? = nil) {
        self.dialRoles = dialRoles
        self.blocked = blocked
        self.error = error
    }
}
