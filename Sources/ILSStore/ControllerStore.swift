import Foundation
public import ILSCore

/// The controller's persistent state: identities, their tokens, services, the audit log and the controllers that
/// share it. Two implementations pass one contract suite (`Tests/ILSStoreTests`): `SQLiteControllerStore`, the
/// embedded default for one controller, and `PostgresControllerStore` (ILSStorePostgres), which several controller
/// replicas share.
///
/// Every method is one transaction and runs off the event loops: a caller on an event loop awaits it, it never
/// blocks one. The controller keeps what the data path reads (identities' states and certificates, services) in
/// memory (`IdentityDirectory`) and follows `changes()`, so neither a circuit nor a connection waits on the store.
///
/// Errors are `ILSError`s: `.conflict` for a duplicate or a lost race, `EnrollmentRefusal` codes for tokens,
/// `.unavailable` when the store cannot be reached (the message says which store, never a password), and
/// `.internalError` for anything else.
public protocol ControllerStore: Sendable {
    /// Adds a pending identity with its first token. Refuses a duplicate name (`.conflict`).
    func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) async throws(ILSError)
    func identity(named name: String) async throws(ILSError) -> IdentityRecord?
    func identity(id: String) async throws(ILSError) -> IdentityRecord?
    /// Every identity, by name.
    func identities() async throws(ILSError) -> [IdentityRecord]
    /// Removes an identity, its tokens and its certificate binding. Returns the record it removed, if it existed.
    func deleteIdentity(named name: String, actor: String) async throws(ILSError) -> IdentityRecord?
    /// Replaces every outstanding token of the identity with `token`.
    func replaceToken(_ token: TokenRecord, actor: String) async throws(ILSError)
    /// Atomically consumes `jti` for `identityID` and binds `certificate`; of concurrent callers, on any number of
    /// controllers sharing the store, exactly one wins. Throws the `EnrollmentRefusal` error that applies (unknown,
    /// used, expired).
    func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        async throws(ILSError) -> IdentityRecord
    /// Moves an identity to `revoked`, `disabled` or back to `active` (from `disabled` only), with an audit entry.
    /// A revocation also deletes the identity's outstanding tokens.
    func changeState(named name: String, to target: IdentityState, actor: String) async throws(ILSError)
        -> IdentityRecord
    /// Replaces the identity's certificate if `previousFingerprint` is still the current one (so two renewals
    /// racing cannot both win, `.conflict` for the loser). Returns the updated record.
    func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        async throws(ILSError) -> IdentityRecord
    /// Records when identities were last seen (id → UNIX seconds), in one transaction: the controller batches
    /// these in memory and writes them every few seconds, so authenticating a request never writes. A time never
    /// moves `last_seen_at` backwards; unknown ids are ignored.
    func recordLastSeen(_ times: [String: Int64]) async throws(ILSError)

    func service(named name: String) async throws(ILSError) -> ServiceRecord?
    /// Every service, by name.
    func services() async throws(ILSError) -> [ServiceRecord]
    /// Adds a service at revision 1, with an audit row. Refuses a duplicate name (`.conflict`).
    func createService(_ service: ServiceRecord, actor: String) async throws(ILSError)
    /// Replaces the service's policies if its revision is still `expectedRevision` (`.conflict` otherwise, and
    /// `.notFound` when it is gone), with an audit row that shows the old and new policies. Returns the record at its
    /// new revision.
    func updateService(_ service: ServiceRecord, expectedRevision: Int64, actor: String) async throws(ILSError)
        -> ServiceRecord
    /// Removes a service, with an audit row. Returns the record it removed, if it existed.
    func deleteService(named name: String, actor: String) async throws(ILSError) -> ServiceRecord?
    /// Replaces an identity's attributes (which policies match on), with an audit row. `.notFound` when it is gone.
    func updateAttributes(named name: String, attributes: [String], actor: String) async throws(ILSError)
        -> IdentityRecord

    /// Appends an audit row. `actor`, `target` and `detail` may come from a peer (a name, a service a gateway
    /// asked for, a refusal sentence): the store keeps them bounded and with control characters escaped
    /// (`AuditLimits`), so a row can neither forge terminal output nor grow without bound.
    func audit(actor: String, action: String, target: String, detail: String) async throws(ILSError)
    /// One page of the audit log, oldest first: the newest `limit` entries at or after `since` (UNIX seconds) whose
    /// `seq` is below `before` (all when nil) and that `filter` matches. The next (older) page is
    /// `before: page.first.seq`.
    func auditEntries(since: Int64, before: Int64?, limit: Int, filter: AuditFilter) async throws(ILSError)
        -> [AuditEntry]
    /// Deletes audit entries older than `olderThan` (UNIX seconds) and the oldest beyond the newest `keepingAtMost`,
    /// at most `batch` rows per transaction so a writer never waits long behind it. Returns how many went.
    func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) async throws(ILSError) -> Int

    /// Says this controller is alive (insert or update by `address`): the cluster's members are the controllers
    /// seen recently (`controllers(seenSince:)`). Gateways and devices learn the list from it.
    func heartbeat(_ member: ControllerMember) async throws(ILSError)
    /// Controllers whose last heartbeat is at or after `seenSince` (UNIX seconds), by address.
    func controllers(seenSince: Int64) async throws(ILSError) -> [ControllerMember]

    /// Everything but the audit log, with what the API never shows (public keys, consumed tokens), for
    /// `controller migrate`.
    func exportRecords() async throws(ILSError) -> StoreRecords
    /// Writes `records` into an empty store in one transaction; refuses (`.conflict`) a store that already has an
    /// identity, so a migration never merges two stores.
    func importRecords(_ records: StoreRecords) async throws(ILSError)
    /// Appends audit entries keeping their `seq` and `at` (`controller migrate` copies the log in pages).
    func importAudit(_ entries: [AuditEntry]) async throws(ILSError)

    /// What other controllers changed in the store, as they change. Each call is a new subscription that ends when
    /// the store is closed. A store only one controller uses (SQLite) returns a stream that finishes at once; the
    /// controller applies its own writes to its directory directly either way.
    func changes() -> AsyncStream<StoreChange>
    /// Finishes in-flight calls and releases connections and threads. Calls after it throw `.unavailable`.
    func close() async
}

extension ControllerStore {
    /// A service the controller itself makes (the default one, at `controller init`).
    public func createService(_ service: ServiceRecord) async throws(ILSError) {
        try await createService(service, actor: "controller")
    }

    /// Every entry at or after `since`, oldest first (tests and small stores; the API pages).
    public func auditEntries(since: Int64) async throws(ILSError) -> [AuditEntry] {
        try await auditEntries(since: since, before: nil, limit: Int(Int32.max))
    }

    /// One unfiltered page.
    public func auditEntries(since: Int64, before: Int64?, limit: Int) async throws(ILSError) -> [AuditEntry] {
        try await auditEntries(since: since, before: before, limit: limit, filter: AuditFilter())
    }
}

/// A change another controller made, as `ControllerStore.changes()` reports it.
public enum StoreChange: Sendable, Hashable {
    /// The identity with this id was created, changed state, enrolled, renewed or deleted: read it again.
    case identity(id: String)
    /// A service was created, changed or deleted.
    case services
    /// A controller joined or left.
    case controllers
    /// Changes may have been missed (the store's notification connection was lost and is back): read everything.
    case resynchronize
}

/// An outstanding (or, in `StoreRecords`, consumed) one-time enrollment token.
public struct TokenRecord: Sendable, Hashable {
    public var jti: String
    public var identityID: String
    public var createdAt: Int64
    public var expiresAt: Int64
    /// When the token was used; nil while it is outstanding.
    public var consumedAt: Int64?

    public init(jti: String, identityID: String, createdAt: Int64, expiresAt: Int64, consumedAt: Int64? = nil) {
        self.jti = jti
        self.identityID = identityID
        self.createdAt = createdAt
        self.expiresAt = expiresAt
        self.consumedAt = consumedAt
    }
}

/// A service and who may dial and bind (host) it (`ServicePolicy`), with a revision that every update moves on, so two
/// admins editing at once cannot silently undo each other (`updateService(_:expectedRevision:actor:)`).
public struct ServiceRecord: Sendable, Hashable, Codable {
    public var name: String
    public var dial: ServicePolicy
    public var bind: ServicePolicy
    /// 1 when created; each update adds one.
    public var revision: Int64

    public init(name: String, dial: ServicePolicy, bind: ServicePolicy, revision: Int64 = 1) {
        self.name = name
        self.dial = dial
        self.bind = bind
        self.revision = revision
    }

    /// A service with the role-only policies every service had before policies: `anyOf` these roles.
    public init(name: String, dialRoles: [IdentityRole], bindRoles: [IdentityRole]) {
        self.init(name: name, dial: .roles(dialRoles), bind: .roles(bindRoles))
    }

    /// The roles column an earlier release reads (`ServicePolicy.legacyRoles`), comma-separated.
    package static func legacyColumn(_ policy: ServicePolicy) -> String {
        policy.legacyRoles.map(\.rawValue).joined(separator: ",")
    }

    /// A policy as stored: the JSON column when set, else the roles column of a row an earlier release wrote (which
    /// is exactly what that row meant: any of these roles). A JSON column that does not parse allows nobody: the
    /// row is refused, not guessed at.
    package static func storedPolicy(json: String?, roles: String) -> ServicePolicy {
        guard let json else {
            return .roles(roles.split(separator: ",").compactMap { IdentityRole(rawValue: String($0)) })
        }
        return (try? JSONDecoder().decode(ServicePolicy.self, from: Data(json.utf8))) ?? .nobody
    }

    /// The JSON column's text.
    package static func storedJSON(_ policy: ServicePolicy) -> String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        return (try? encoder.encode(policy)).map { String(decoding: $0, as: UTF8.self) }
            ?? #"{"semantic":"anyOf","tokens":[]}"#
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

/// A controller replica sharing the store: the same value `GET /v1/controllers` answers with.
public typealias ControllerMember = ControllerAPI.ControllerInfo

/// A whole store but its audit log, for `controller migrate`.
public struct StoreRecords: Sendable, Hashable {
    /// An identity with its enrolled public key (base64url), which `IdentityRecord` does not carry.
    public struct Identity: Sendable, Hashable {
        public var record: IdentityRecord
        public var publicKey: String?

        public init(record: IdentityRecord, publicKey: String?) {
            self.record = record
            self.publicKey = publicKey
        }
    }

    public var identities: [Identity]
    /// Outstanding and consumed tokens.
    public var tokens: [TokenRecord]
    public var services: [ServiceRecord]

    public init(identities: [Identity], tokens: [TokenRecord], services: [ServiceRecord]) {
        self.identities = identities
        self.tokens = tokens
        self.services = services
    }
}

public typealias AuditEntry = ControllerAPI.AuditEntry
public typealias AuditFilter = ControllerAPI.AuditFilter

/// What the audit log keeps of a string a peer chose.
public enum AuditLimits {
    /// Names are at most 64 characters; a service name a gateway sends, or a peer address, fits too.
    public static let field = 128
    /// A refusal sentence with a name or two in it.
    public static let detail = 512
}
