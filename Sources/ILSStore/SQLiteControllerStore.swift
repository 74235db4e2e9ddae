public import ILSCore
import NIOConcurrencyHelpers
import NIOPosix

/// The embedded store for one controller: a SQLite file in WAL mode, `synchronous=FULL`.
///
/// Every call runs its transaction (`SQLiteStoreTransactions`) on NIO's blocking-I/O thread pool, so no event loop
/// waits for a disk flush. The bindings to the
/// system's libsqlite3 are ours (SQLiteDatabase, about 120 lines): each method here is one whole transaction
/// (`BEGIN IMMEDIATE` … `COMMIT`) run on one thread, which is all the store needs; sqlite-nio would make each
/// statement a separate asynchronous hop inside the transaction and bring a second, vendored copy of SQLite, while
/// Debian's libsqlite3 gets the distribution's security fixes. GRDB would add some 40,000 lines for the same two
/// pool threads.
public final class SQLiteControllerStore: ControllerStore {
    /// SQLite's name for a database that is never written to disk.
    public static let inMemory = ":memory:"

    private let transactions: SQLiteStoreTransactions
    private let closed = NIOLockedValueBox(false)
    public let path: String

    /// NIO's blocking-I/O pool (one per process, a thread per core, never shut down): no event loop waits for a
    /// transaction. A pool of the store's own leaked its work queue at exit under LeakSanitizer, as NIO's
    /// perpetual pool does (deploy/sanitizers/lsan.supp).
    private static var threads: NIOThreadPool { .singleton }

    /// Opens (creating if needed, 0600) the store at `path` and brings its schema up to date;
    /// `SQLiteControllerStore.inMemory` is a private store that lives as long as this object (tests and fuzzing).
    public init(path: String) throws(ILSError) {
        self.path = path
        transactions = try SQLiteStoreTransactions(path: path)
    }

    private func run<T: Sendable>(_ body: @escaping @Sendable (SQLiteStoreTransactions) throws(ILSError) -> T)
        async throws(ILSError) -> T
    {
        let transactions = self.transactions
        guard !closed.withLockedValue({ $0 }) else { throw ILSError(.unavailable, "the store \(path) is closed") }
        let result: Result<T, ILSError>
        do {
            result = try await Self.threads.runIfActive { () -> Result<T, ILSError> in
                Result { () throws(ILSError) -> T in try body(transactions) }
            }
        } catch {
            throw ILSError(.unavailable, "the store \(path) is closed")
        }
        return try result.get()
    }

    public func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.createIdentity(identity, token: token, actor: actor) }
    }

    public func identity(named name: String) async throws(ILSError) -> IdentityRecord? {
        try await run { stores throws(ILSError) in try stores.identity(named: name) }
    }

    public func identity(id: String) async throws(ILSError) -> IdentityRecord? {
        try await run { stores throws(ILSError) in try stores.identity(id: id) }
    }

    public func identities() async throws(ILSError) -> [IdentityRecord] {
        try await run { stores throws(ILSError) in try stores.identities() }
    }

    public func deleteIdentity(named name: String, actor: String) async throws(ILSError) -> IdentityRecord? {
        try await run { stores throws(ILSError) in try stores.deleteIdentity(named: name, actor: actor) }
    }

    public func replaceToken(_ token: TokenRecord, actor: String) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.replaceToken(token, actor: actor) }
    }

    public func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        async throws(ILSError) -> IdentityRecord
    {
        try await run { stores throws(ILSError) in
            try stores.consumeToken(jti: jti, identityID: identityID, now: now, certificate: certificate)
        }
    }

    public func changeState(named name: String, to target: IdentityState, actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await run { stores throws(ILSError) in try stores.changeState(named: name, to: target, actor: actor) }
    }

    public func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        async throws(ILSError) -> IdentityRecord
    {
        try await run { stores throws(ILSError) in
            try stores.renewCertificate(
                id: id,
                previousFingerprint: previousFingerprint,
                certificate: certificate,
                now: now
            )
        }
    }

    public func recordLastSeen(_ times: [String: Int64]) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.recordLastSeen(times) }
    }

    public func service(named name: String) async throws(ILSError) -> ServiceRecord? {
        try await run { stores throws(ILSError) in try stores.service(named: name) }
    }

    public func services() async throws(ILSError) -> [ServiceRecord] {
        try await run { stores throws(ILSError) in try stores.services() }
    }

    public func createService(_ service: ServiceRecord, actor: String) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.createService(service, actor: actor) }
    }

    public func updateService(_ service: ServiceRecord, expectedRevision: Int64, actor: String) async throws(ILSError)
        -> ServiceRecord
    {
        try await run { stores throws(ILSError) in
            try stores.updateService(service, expectedRevision: expectedRevision, actor: actor)
        }
    }

    public func deleteService(named name: String, actor: String) async throws(ILSError) -> ServiceRecord? {
        try await run { stores throws(ILSError) in try stores.deleteService(named: name, actor: actor) }
    }

    public func updateAttributes(named name: String, attributes: [String], actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await run { stores throws(ILSError) in
            try stores.updateAttributes(named: name, attributes: attributes, actor: actor)
        }
    }

    public func audit(actor: String, action: String, target: String, detail: String) async throws(ILSError) {
        try await run { stores throws(ILSError) in
            try stores.audit(actor: actor, action: action, target: target, detail: detail)
        }
    }

    public func auditEntries(since: Int64, before: Int64?, limit: Int, filter: AuditFilter) async throws(ILSError)
        -> [AuditEntry]
    {
        try await run { stores throws(ILSError) in
            try stores.auditEntries(since: since, before: before, limit: limit, filter: filter)
        }
    }

    public func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) async throws(ILSError) -> Int {
        try await run { stores throws(ILSError) in
            try stores.pruneAudit(olderThan: olderThan, keepingAtMost: keepingAtMost, batch: batch)
        }
    }

    public func heartbeat(_ member: ControllerMember) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.heartbeat(member) }
    }

    public func controllers(seenSince: Int64) async throws(ILSError) -> [ControllerMember] {
        try await run { stores throws(ILSError) in try stores.controllers(seenSince: seenSince) }
    }

    public func exportRecords() async throws(ILSError) -> StoreRecords {
        try await run { stores throws(ILSError) in try stores.exportRecords() }
    }

    public func importRecords(_ records: StoreRecords) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.importRecords(records) }
    }

    public func importAudit(_ entries: [AuditEntry]) async throws(ILSError) {
        try await run { stores throws(ILSError) in try stores.importAudit(entries) }
    }

    /// `PRAGMA integrity_check`, for operators and fault tests.
    public func integrityCheck() async throws(ILSError) -> Bool {
        try await run { stores throws(ILSError) in try stores.integrityCheck() }
    }

    /// One controller per SQLite file: nobody else writes it, so there is nothing to report.
    public func changes() -> AsyncStream<StoreChange> {
        AsyncStream { $0.finish() }
    }

    public func close() async {
        closed.withLockedValue { $0 = true }
    }
}
