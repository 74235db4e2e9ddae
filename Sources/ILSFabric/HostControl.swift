public import ILSCore

/// The message the controller sends a gateway on the control stream after checking its bind permission.
public struct HostControlMessage: Codable, Sendable {
    /// Roles allowed to dial the service; the gateway enforces this itself on every circuit.
    public var dialRoles: [IdentityRole]?
    /// Ids of identities that must never be let in, whatever their certificate says.
    public var revoked: [String]?
    /// Set instead when the gateway may not host the service.
    public var error: String?

    public init(dialRoles: [IdentityRole]? = nil, revoked: [String]? = nil, error: String? = nil) {
        self.dialRoles = dialRoles
        self.revoked = revoked
        self.error = error
    }
}
