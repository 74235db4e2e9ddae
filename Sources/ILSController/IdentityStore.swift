public import ILSCore

/// An outstanding one-time enrollment token.
public struct TokenRecord: Sendable, Hashable {
    public var jti: String
    public var identityID: String
    public var createdAt: Int64
    public var expiresAt: Int64

    public init(jti: String, identityID: String, createdAt: Int64, expiresAt: Int64) {
        self.jti = jti
        self.identityID = identityID
        self.createdAt = createdAt
        self.expiresAt = expiresAt
    }
}

/// A service and who may dial and bind (host) it, by role.
public struct ServiceRecord: Sendable, Hashable, Codable {
    public var name: String
    public var dialRoles: [IdentityRole]
    public var bindRoles: [IdentityRole]

    public init(name: String, dialRoles: [IdentityRole], bindRoles: [IdentityRole]) {
        self.name = name
        self.dialRoles = dialRoles
        self.bindRoles = bindRoles
    }
}

/// The certificate an enrollment installs.
public struct EnrolledCertificate: Sendable {
    public var fingerprint: String
    public var notAfter: Int64
    public var publicKey: String

    public init(fingerprint: String, notAfter: Int64, publicKey: String) {
        self.fingerprint = fingerprint
        self.notAfter = notAfter
        self.publicKey = publicKey
    }
}

/// The controller's persistent state. SQLite (`SQLiteIdentityStore`) is the embedded default; the protocol exists
/// so a PostgreSQL store can back several controller replicas later. Every method is one transaction.
public protocol IdentityStore: Sendable {
    /// Adds a pending identity with its first token. Refuses a duplicate name.
    func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) throws(ILSError)
    func identity(named name: String) throws(ILSError) -> IdentityRecord?
    func identity(id: String) throws(ILSError) -> IdentityRecord?
    func identities() throws(ILSError) -> [IdentityRecord]
    /// Removes an identity, its tokens and its certificate binding. Returns whether it existed.
    func deleteIdentity(named name: String, actor: String) throws(ILSError) -> Bool
    /// Replaces every outstanding token of the identity with `token`.
    func replaceToken(_ token: TokenRecord, actor: String) throws(ILSError)
    /// Atomically consumes `jti` for `identityID` and binds `certificate`; exactly one concurrent caller can win.
    /// Throws the `EnrollmentRefusal` error that applies (unknown, used, expired).
    func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        throws(ILSError) -> IdentityRecord
    /// Moves an identity to `revoked`, `disabled` or back to `active` (from `disabled` only), with an audit entry.
    func changeState(named name: String, to target: IdentityState, actor: String) throws(ILSError) -> IdentityRecord
    /// Replaces the identity's certificate if `previousFingerprint` is still the current one (so two renewals
    /// racing cannot both win). Returns the updated record.
    func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        throws(ILSError) -> IdentityRecord
    /// Records that the identity connected just now.
    func touch(id: String, at time: Int64) throws(ILSError)
    func service(named name: String) throws(ILSError) -> ServiceRecord?
    func createService(_ service: ServiceRecord) throws(ILSError)
    /// Appends an audit row. `actor`, `target` and `detail` may come from a peer (a name, a service a gateway
    /// asked for, a refusal sentence): the store keeps them bounded and with control characters escaped
    /// (`AuditLimits`), so a row can neither forge terminal output nor grow without bound.
    func audit(actor: String, action: String, target: String, detail: String) throws(ILSError)
    /// One page of the audit log, oldest first: the newest `limit` entries at or after `since` (UNIX seconds) whose
    /// `seq` is below `before` (all when nil). The next (older) page is `before: page.first.seq`.
    func auditEntries(since: Int64, before: Int64?, limit: Int) throws(ILSError) -> [AuditEntry]
    /// Deletes audit entries older than `olderThan` (UNIX seconds) and the oldest beyond the newest `keepingAtMost`,
    /// at most `batch` rows per transaction so a writer never waits long behind it. Returns how many went.
    func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) throws(ILSError) -> Int
}

extension IdentityStore {
    /// Every entry at or after `since`, oldest first (tests and small stores; the API pages).
    public func auditEntries(since: Int64) throws(ILSError) -> [AuditEntry] {
        try auditEntries(since: since, before: nil, limit: Int(Int32.max))
    }
}

public typealias AuditEntry = ControllerAPI.AuditEntry

/// What the audit log keeps of a string a peer chose.
public enum AuditLimits {
    /// Names are at most 64 characters; a service name a gateway sends, or a peer address, fits too.
    public static let field = 128
    /// A refusal sentence with a name or two in it.
    public static let detail = 512
}
