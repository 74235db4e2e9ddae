/// What an identity may do in the overlay. The role is bound into the identity's certificate by the controller.
public enum IdentityRole: String, Codable, Sendable, CaseIterable {
    /// An iPad, phone or laptop: dials services.
    case device
    /// A gateway next to a backend: hosts (binds) services.
    case gateway
    /// An operator: may call the admin API.
    case admin
}

/// Where an identity is in its life. Only `active` identities authenticate.
public enum IdentityState: String, Codable, Sendable {
    /// Created; its one-time enrollment token has not been used yet.
    case pending
    case active
    /// Temporarily blocked by an admin; can be enabled again.
    case disabled
    /// Permanently blocked; a device needs a new identity.
    case revoked
}

/// An identity as the controller's store and admin API describe it. Contains no key material.
public struct IdentityRecord: Codable, Sendable, Hashable {
    public var id: String
    public var name: String
    public var role: IdentityRole
    public var attributes: [String]
    public var state: IdentityState
    public var createdAt: Int64
    /// SHA-256 of the DER of the identity's current certificate; `nil` until enrolled.
    public var certificateFingerprint: String?
    /// Unix seconds when the current certificate expires; `nil` until enrolled.
    public var certificateNotAfter: Int64?
    public var lastSeenAt: Int64?

    public init(
        id: String,
        name: String,
        role: IdentityRole,
        attributes: [String],
        state: IdentityState,
        createdAt: Int64,
        certificateFingerprint: String? = nil,
        certificateNotAfter: Int64? = nil,
        lastSeenAt: Int64? = nil
    ) {
        self.id = id
        self.name = name
        self.role = role
        self.attributes = attributes
        self.state = state
        self.createdAt = createdAt
        self.certificateFingerprint = certificateFingerprint
        self.certificateNotAfter = certificateNotAfter
        self.lastSeenAt = lastSeenAt
    }
}

/// Identity names are used in file names (`identities/NAME.json`) and headers, so they are restricted to a safe
/// alphabet: 1 to 64 of `a-z A-Z 0-9 . _ -`, not starting with `.` or `-` (no path traversal, no header injection).
public enum IdentityName {
    public static func validate(_ name: String) throws(ILSError) {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= 97 && byte <= 122) || (byte >= 65 && byte <= 90) || (byte >= 48 && byte <= 57)
                || byte == 46 || byte == 95 || byte == 45
        }
        guard !name.isEmpty, name.utf8.count <= 64, allowed, !name.hasPrefix("."), !name.hasPrefix("-") else {
            throw ILSError(
                .invalidArgument,
                "'\(ControlCharacters.escaped(String(name.prefix(80))))' is not a valid identity name; "
                    + "use 1-64 letters, digits, '.', '_' or '-'"
            )
        }
    }
}
