import Foundation
public import ILSCore
public import ILSStore
public import Logging
import PostgresNIO

/// The store several controller replicas share: PostgreSQL through postgres-nio's `PostgresClient` (a pool of at
/// most 8 connections). Same tables, rules and audit rows as `SQLiteControllerStore`; the contract suite runs on both.
///
/// - Every method is one transaction. The one-time token is consumed under a row lock (`SELECT … FOR UPDATE`), so of
///   two controllers racing on it exactly one sees it unconsumed; state changes lock the identity's row the same way.
/// - Every write that changes an identity, the services or the controller list also runs
///   `pg_notify('ils_changes', …)` in its transaction: PostgreSQL delivers it at commit, to every controller
///   listening (`changes()`), and never for a transaction that rolled back.
/// - Bounded in time: connecting gives up after 5 s, the server cancels a statement after 5 s
///   (`statement_timeout`), and each call as a whole after 10 s, so a store that is down answers `.unavailable`
///   instead of hanging a request.
/// - The password never appears in a message or a log line: errors name `description` (the URL redacted).
public final class PostgresControllerStore: ControllerStore {
    /// The channel every notification goes on.
    static let channel = "ils_changes"
    /// A call that has not finished after this long fails with `.unavailable`.
    static let callTimeout: Duration = .seconds(10)

    private let client: PostgresClient
    private let running: Task<Void, Never>
    private let logger: Logger
    private let feedProbe: ChangeFeedProbe
    public let description: String

    /// Each entry upgrades the schema by one version (`ils_schema.version`); never edit a shipped entry.
    private static let migrations: [[PostgresQuery]] = [
        [
            """
            CREATE TABLE identities (
                id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL, attributes TEXT NOT NULL,
                state TEXT NOT NULL, created_at BIGINT NOT NULL, cert_fingerprint TEXT, cert_not_after BIGINT,
                public_key TEXT, last_seen_at BIGINT)
            """,
            """
            CREATE TABLE enrollment_tokens (
                jti TEXT PRIMARY KEY, identity_id TEXT NOT NULL REFERENCES identities(id) ON DELETE CASCADE,
                created_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, consumed_at BIGINT)
            """,
            "CREATE INDEX enrollment_tokens_identity ON enrollment_tokens(identity_id)",
            """
            CREATE TABLE services (
                name TEXT PRIMARY KEY, dial_roles TEXT NOT NULL, bind_roles TEXT NOT NULL, created_at BIGINT NOT NULL)
            """,
            """
            CREATE TABLE audit (
                seq BIGSERIAL PRIMARY KEY, at BIGINT NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
                target TEXT NOT NULL, detail TEXT NOT NULL)
            """,
            "CREATE INDEX audit_at ON audit(at)",
            """
            CREATE TABLE controllers (
                address TEXT PRIMARY KEY, started_at BIGINT NOT NULL, last_seen_at BIGINT NOT NULL)
            """,
        ],
        // Services and policies, as SQLite's migration 4: the policies as JSON (NULL in a row an earlier release
        // wrote: its roles columns, still written for a replica of that release, then say what it means).
        [
            """
            ALTER TABLE services ADD COLUMN dial_policy TEXT, ADD COLUMN bind_policy TEXT,
                ADD COLUMN revision BIGINT NOT NULL DEFAULT 1
            """
        ],
    ]

    /// Connects to `url` and brings the schema up to date. Two controllers starting at once migrate one after the
    /// other (a transaction-scoped advisory lock); a schema newer than this build knows is refused.
    public init(url: String, logger: Logger, feedProbe: ChangeFeedProbe = .standard) async throws(ILSError) {
        let configuration = try PostgresConfiguration(url: url)
        description = configuration.description
        self.logger = logger
        self.feedProbe = feedProbe
        let client = PostgresClient(configuration: configuration.client, backgroundLogger: logger)
        self.client = client
        running = Task { await client.run() }
        do throws(ILSError) {
            try await migrate()
        } catch {
            running.cancel()
            _ = await running.value
            throw error
        }
    }

    deinit {
        running.cancel()
    }

    public func close() async {
        running.cancel()
        _ = await running.value
    }

    // MARK: - Running calls

    /// Runs `body` in one transaction, bounded by `callTimeout`, with postgres-nio's errors turned into `ILSError`s.
    private func transaction<T: Sendable>(
        _ body: @escaping @Sendable (PostgresConnection) async throws -> T
    ) async throws(ILSError) -> T {
        let client = self.client
        let logger = self.logger
        return try await bounded { try await client.withTransaction(logger: logger) { try await body($0) } }
    }

    private func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws(ILSError) -> T {
        let description = self.description
        do {
            return try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask { try await body() }
                group.addTask {
                    try await Task.sleep(for: Self.callTimeout)
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let value = first else {
                    throw ILSError(.unavailable, "the store \(description) did not answer in time")
                }
                return value
            }
        } catch let error as ILSError {
            throw error
        } catch let error as PSQLError {
            throw Self.translate(error, description: description)
        } catch {
            // A transaction's closure rethrows our own errors wrapped by postgres-nio.
            if let wrapped = (error as? PostgresTransactionError)?.closureError as? ILSError { throw wrapped }
            if let psql = (error as? PostgresTransactionError)?.closureError as? PSQLError {
                throw Self.translate(psql, description: description)
            }
            if let failure = error as? PostgresTransactionError,
                let psql = (failure.beginError ?? failure.commitError) as? PSQLError
            {
                throw Self.translate(psql, description: description)
            }
            throw ILSError(.unavailable, "the store \(description) failed", detail: "\(type(of: error))")
        }
    }

    /// A server's refusal by SQLSTATE; anything else means the store could not be reached.
    static func translate(_ error: PSQLError, description: String) -> ILSError {
        if let state = error.serverInfo?[.sqlState] {
            switch state {
            case "23505": return ILSError(.conflict, "that would duplicate an entry")
            case "57014": return ILSError(.unavailable, "the store \(description) did not answer in time")
            default:
                let message = error.serverInfo?[.message] ?? ""
                return ILSError(
                    .internalError,
                    "the identity store failed (SQLSTATE \(state))",
                    detail: ControlCharacters.bounded(message, limit: 300)
                )
            }
        }
        return ILSError(.unavailable, "the store \(description) cannot be reached", detail: "\(error.code)")
    }

    private func migrate() async throws(ILSError) {
        let description = self.description
        let migrations = Self.migrations
        try await transaction { connection in
            let logger = Logger(label: "ils.store.migrate", factory: { _ in SwiftLogNoOpLogHandler() })
            try await connection.query("SELECT pg_advisory_xact_lock(7305125)", logger: logger)
            try await connection.query(
                "CREATE TABLE IF NOT EXISTS ils_schema (version INTEGER NOT NULL)",
                logger: logger
            )
            var version = 0
            for try await (value) in try await connection.query("SELECT version FROM ils_schema", logger: logger)
                .decode(Int.self)
            {
                version = value
            }
            guard version <= migrations.count else {
                throw ILSError(
                    .invalidInput,
                    "the store \(description) was written by a newer ils-gateway (schema \(version)); upgrade first"
                )
            }
            for migration in migrations.dropFirst(version) {
                for statement in migration { try await connection.query(statement, logger: logger) }
            }
            if version == 0 {
                try await connection.query(
                    "INSERT INTO ils_schema (version) VALUES (\(migrations.count))",
                    logger: logger
                )
            } else {
                try await connection.query("UPDATE ils_schema SET version = \(migrations.count)", logger: logger)
            }
        }
    }

    // MARK: - Rows

    private typealias IdentityRow = (String, String, String, String, String, Int64, String?, Int64?, Int64?)
    private static let identityColumns =
        "id, name, role, attributes, state, created_at, cert_fingerprint, cert_not_after, last_seen_at"

    private static func identity(_ row: IdentityRow) -> IdentityRecord? {
        guard let role = IdentityRole(rawValue: row.2), let state = IdentityState(rawValue: row.4) else { return nil }
        return IdentityRecord(
            id: row.0,
            name: row.1,
            role: role,
            attributes: row.3.split(separator: ",").map(String.init),
            state: state,
            createdAt: row.5,
            certificateFingerprint: row.6,
            certificateNotAfter: row.7,
            lastSeenAt: row.8
        )
    }

    private static let quiet = Logger(label: "ils.store", factory: { _ in SwiftLogNoOpLogHandler() })

    private static func identities(_ connection: PostgresConnection, where clause: PostgresQuery) async throws
        -> [IdentityRecord]
    {
        var query: PostgresQuery = "SELECT "
        query.sql += identityColumns + " FROM identities " + clause.sql
        query.binds = clause.binds
        var records: [IdentityRecord] = []
        for try await row in try await connection.query(query, logger: quiet).decode(IdentityRow.self) {
            if let record = identity(row) { records.append(record) }
        }
        return records
    }

    private static func notify(_ connection: PostgresConnection, _ payload: String) async throws {
        try await connection.query("SELECT pg_notify(\(channel), \(payload))", logger: quiet)
    }

    /// Every audit row goes through here, bounded and escaped like SQLite's (`AuditLimits`).
    private static func insertAudit(
        _ connection: PostgresConnection,
        actor: String,
        action: String,
        target: String,
        detail: String
    ) async throws {
        let at = Int64(Date().timeIntervalSince1970)
        let actor = ControlCharacters.bounded(actor, limit: AuditLimits.field)
        let action = ControlCharacters.bounded(action, limit: AuditLimits.field)
        let target = ControlCharacters.bounded(target, limit: AuditLimits.field)
        let detail = ControlCharacters.bounded(detail, limit: AuditLimits.detail)
        try await connection.query(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (\(at), \(actor), \(action), \(target), \(detail))",
            logger: quiet
        )
    }

    private static func insertToken(_ connection: PostgresConnection, _ token: TokenRecord) async throws {
        try await connection.query(
            """
            INSERT INTO enrollment_tokens (jti, identity_id, created_at, expires_at, consumed_at)
            VALUES (\(token.jti), \(token.identityID), \(token.createdAt), \(token.expiresAt), \(token.consumedAt))
            """,
            logger: quiet
        )
    }

    // MARK: - Identities

    public func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) async throws(ILSError) {
        try await transaction { connection in
            let existing = try await Self.identities(connection, where: "WHERE name = \(identity.name) FOR UPDATE")
            guard existing.isEmpty else {
                throw ILSError(.conflict, "an identity named '\(identity.name)' already exists")
            }
            let attributes = identity.attributes.joined(separator: ",")
            try await connection.query(
                """
                INSERT INTO identities (id, name, role, attributes, state, created_at)
                VALUES (\(identity.id), \(identity.name), \(identity.role.rawValue), \(attributes),
                    \(identity.state.rawValue), \(identity.createdAt))
                """,
                logger: Self.quiet
            )
            try await Self.insertToken(connection, token)
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "identity.create",
                target: identity.name,
                detail: "role=\(identity.role.rawValue)"
            )
            try await Self.notify(connection, "identity:\(identity.id)")
        }
    }

    public func identity(named name: String) async throws(ILSError) -> IdentityRecord? {
        try await transaction { try await Self.identities($0, where: "WHERE name = \(name)").first }
    }

    public func identity(id: String) async throws(ILSError) -> IdentityRecord? {
        try await transaction { try await Self.identities($0, where: "WHERE id = \(id)").first }
    }

    public func identities() async throws(ILSError) -> [IdentityRecord] {
        try await transaction { try await Self.identities($0, where: "ORDER BY name") }
    }

    public func deleteIdentity(named name: String, actor: String) async throws(ILSError) -> IdentityRecord? {
        try await transaction { connection in
            guard let record = try await Self.identities(connection, where: "WHERE name = \(name) FOR UPDATE").first
            else { return nil }
            try await connection.query("DELETE FROM identities WHERE id = \(record.id)", logger: Self.quiet)
            try await Self.insertAudit(connection, actor: actor, action: "identity.delete", target: name, detail: "")
            try await Self.notify(connection, "identity:\(record.id)")
            return record
        }
    }

    public func replaceToken(_ token: TokenRecord, actor: String) async throws(ILSError) {
        try await transaction { connection in
            let owner = try await Self.identities(connection, where: "WHERE id = \(token.identityID) FOR UPDATE").first
            try await connection.query(
                "DELETE FROM enrollment_tokens WHERE identity_id = \(token.identityID) AND consumed_at IS NULL",
                logger: Self.quiet
            )
            try await Self.insertToken(connection, token)
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "identity.reissue",
                target: owner?.name ?? token.identityID,
                detail: ""
            )
        }
    }

    public func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        async throws(ILSError) -> IdentityRecord
    {
        try await transaction { connection in
            // The row lock makes racing consumers, on any controller, take turns: the second reads the first's
            // `consumed_at` once the first commits.
            var found: (String, Int64, Int64?)?
            for try await row in try await connection.query(
                "SELECT identity_id, expires_at, consumed_at FROM enrollment_tokens WHERE jti = \(jti) FOR UPDATE",
                logger: Self.quiet
            ).decode((String, Int64, Int64?).self) {
                found = row
            }
            guard let found, found.0 == identityID else { throw EnrollmentRefusal.unknown.error }
            guard found.2 == nil else { throw EnrollmentRefusal.used.error }
            guard now < found.1 else { throw EnrollmentRefusal.expired.error }
            try await connection.query(
                "UPDATE enrollment_tokens SET consumed_at = \(now) WHERE jti = \(jti)",
                logger: Self.quiet
            )
            let updated = try await Self.identities(
                connection,
                where: """
                    WHERE id = \(identityID) AND state IN ('pending', 'active', 'disabled') FOR UPDATE
                    """
            )
            guard !updated.isEmpty else { throw EnrollmentRefusal.unknown.error }
            try await connection.query(
                """
                UPDATE identities SET state = CASE state WHEN 'pending' THEN 'active' ELSE state END,
                    cert_fingerprint = \(certificate.fingerprint), cert_not_after = \(certificate.notAfter),
                    public_key = \(certificate.publicKey), last_seen_at = \(now)
                WHERE id = \(identityID)
                """,
                logger: Self.quiet
            )
            guard let record = try await Self.identities(connection, where: "WHERE id = \(identityID)").first else {
                throw EnrollmentRefusal.unknown.error
            }
            try await Self.insertAudit(
                connection,
                actor: record.name,
                action: "identity.enroll",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            try await Self.notify(connection, "identity:\(identityID)")
            return record
        }
    }

    public func changeState(named name: String, to target: IdentityState, actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await transaction { connection in
            guard let current = try await Self.identities(connection, where: "WHERE name = \(name) FOR UPDATE").first
            else { throw ILSError(.notFound, "no identity named '\(name)'") }
            let allowed: Bool
            switch (current.state, target) {
            case (.revoked, _): allowed = false
            case (_, .revoked): allowed = true
            case (.active, .disabled), (.pending, .disabled): allowed = true
            case (.disabled, .active): allowed = true
            default: allowed = false
            }
            guard allowed else {
                throw ILSError(
                    .conflict,
                    "identity '\(name)' is \(current.state.rawValue) and cannot become \(target.rawValue)"
                )
            }
            try await connection.query(
                "UPDATE identities SET state = \(target.rawValue) WHERE id = \(current.id)",
                logger: Self.quiet
            )
            if target == .revoked {
                try await connection.query(
                    "DELETE FROM enrollment_tokens WHERE identity_id = \(current.id)",
                    logger: Self.quiet
                )
            }
            let action =
                target == .revoked ? "identity.revoke" : target == .disabled ? "identity.disable" : "identity.enable"
            try await Self.insertAudit(connection, actor: actor, action: action, target: name, detail: "")
            try await Self.notify(connection, "identity:\(current.id)")
            var updated = current
            updated.state = target
            return updated
        }
    }

    public func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        async throws(ILSError) -> IdentityRecord
    {
        try await transaction { connection in
            let current = try await Self.identities(
                connection,
                where: "WHERE id = \(id) AND cert_fingerprint = \(previousFingerprint) AND state = 'active' FOR UPDATE"
            )
            guard !current.isEmpty else { throw ILSError(.conflict, "the certificate was already renewed or replaced") }
            try await connection.query(
                """
                UPDATE identities SET cert_fingerprint = \(certificate.fingerprint),
                    cert_not_after = \(certificate.notAfter), public_key = \(certificate.publicKey),
                    last_seen_at = \(now)
                WHERE id = \(id)
                """,
                logger: Self.quiet
            )
            guard let record = try await Self.identities(connection, where: "WHERE id = \(id)").first else {
                throw ILSError(.conflict, "the certificate was already renewed or replaced")
            }
            try await Self.insertAudit(
                connection,
                actor: record.name,
                action: "identity.renew",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            try await Self.notify(connection, "identity:\(id)")
            return record
        }
    }

    public func recordLastSeen(_ times: [String: Int64]) async throws(ILSError) {
        guard !times.isEmpty else { return }
        let sorted = times.sorted { $0.key < $1.key }
        try await transaction { connection in
            for (id, time) in sorted {
                try await connection.query(
                    """
                    UPDATE identities SET last_seen_at = \(time)
                    WHERE id = \(id) AND (last_seen_at IS NULL OR last_seen_at < \(time))
                    """,
                    logger: Self.quiet
                )
            }
        }
    }

    // MARK: - Services

    private static func services(_ connection: PostgresConnection, where clause: PostgresQuery) async throws
        -> [ServiceRecord]
    {
        var query: PostgresQuery =
            "SELECT name, dial_roles, bind_roles, dial_policy, bind_policy, revision FROM services "
        query.sql += clause.sql
        query.binds = clause.binds
        var services: [ServiceRecord] = []
        for try await (name, dialRoles, bindRoles, dial, bind, revision) in try await connection.query(
            query,
            logger: quiet
        ).decode((String, String, String, String?, String?, Int64).self) {
            services.append(
                ServiceRecord(
                    name: name,
                    dial: ServiceRecord.storedPolicy(json: dial, roles: dialRoles),
                    bind: ServiceRecord.storedPolicy(json: bind, roles: bindRoles),
                    revision: revision
                )
            )
        }
        return services
    }

    /// Inserts `service`; false when the name is taken.
    private static func insertService(_ connection: PostgresConnection, _ service: ServiceRecord) async throws
        -> Bool
    {
        let dialRoles = ServiceRecord.legacyColumn(service.dial)
        let bindRoles = ServiceRecord.legacyColumn(service.bind)
        let dial = ServiceRecord.storedJSON(service.dial)
        let bind = ServiceRecord.storedJSON(service.bind)
        let now = Int64(Date().timeIntervalSince1970)
        var inserted = false
        for try await _ in try await connection.query(
            """
            INSERT INTO services (name, dial_roles, bind_roles, dial_policy, bind_policy, revision, created_at)
            VALUES (\(service.name), \(dialRoles), \(bindRoles), \(dial), \(bind), \(service.revision), \(now))
            ON CONFLICT (name) DO NOTHING RETURNING name
            """,
            logger: quiet
        ) {
            inserted = true
        }
        return inserted
    }

    public func service(named name: String) async throws(ILSError) -> ServiceRecord? {
        try await transaction { try await Self.services($0, where: "WHERE name = \(name)").first }
    }

    public func services() async throws(ILSError) -> [ServiceRecord] {
        try await transaction { try await Self.services($0, where: "ORDER BY name") }
    }

    public func createService(_ service: ServiceRecord, actor: String) async throws(ILSError) {
        try await transaction { connection in
            var created = service
            created.revision = 1
            guard try await Self.insertService(connection, created) else {
                throw ILSError(.conflict, "a service named '\(service.name)' already exists")
            }
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "service.create",
                target: service.name,
                detail: ServiceAudit.created(created)
            )
            try await Self.notify(connection, "services")
        }
    }

    public func updateService(_ service: ServiceRecord, expectedRevision: Int64, actor: String) async throws(ILSError)
        -> ServiceRecord
    {
        try await transaction { connection in
            guard
                let current = try await Self.services(connection, where: "WHERE name = \(service.name) FOR UPDATE")
                    .first
            else { throw ILSError(.notFound, "no service named '\(service.name)'") }
            guard current.revision == expectedRevision else { throw ServiceAudit.stale(service.name) }
            var updated = service
            updated.revision = current.revision + 1
            let dialRoles = ServiceRecord.legacyColumn(updated.dial)
            let bindRoles = ServiceRecord.legacyColumn(updated.bind)
            let dial = ServiceRecord.storedJSON(updated.dial)
            let bind = ServiceRecord.storedJSON(updated.bind)
            try await connection.query(
                """
                UPDATE services SET dial_roles = \(dialRoles), bind_roles = \(bindRoles), dial_policy = \(dial),
                    bind_policy = \(bind), revision = \(updated.revision)
                WHERE name = \(updated.name)
                """,
                logger: Self.quiet
            )
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "service.update",
                target: service.name,
                detail: ServiceAudit.updated(from: current, to: updated)
            )
            try await Self.notify(connection, "services")
            return updated
        }
    }

    public func deleteService(named name: String, actor: String) async throws(ILSError) -> ServiceRecord? {
        try await transaction { connection in
            guard let current = try await Self.services(connection, where: "WHERE name = \(name) FOR UPDATE").first
            else { return nil }
            try await connection.query("DELETE FROM services WHERE name = \(name)", logger: Self.quiet)
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "service.delete",
                target: name,
                detail: ServiceAudit.created(current)
            )
            try await Self.notify(connection, "services")
            return current
        }
    }

    public func updateAttributes(named name: String, attributes: [String], actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await transaction { connection in
            guard var record = try await Self.identities(connection, where: "WHERE name = \(name) FOR UPDATE").first
            else { throw ILSError(.notFound, "no identity named '\(name)'") }
            let before = record.attributes
            record.attributes = attributes
            let joined = attributes.joined(separator: ",")
            try await connection.query(
                "UPDATE identities SET attributes = \(joined) WHERE id = \(record.id)",
                logger: Self.quiet
            )
            try await Self.insertAudit(
                connection,
                actor: actor,
                action: "identity.attributes",
                target: name,
                detail: ServiceAudit.attributes(from: before, to: attributes)
            )
            try await Self.notify(connection, "identity:\(record.id)")
            return record
        }
    }

    // MARK: - Audit

    public func audit(actor: String, action: String, target: String, detail: String) async throws(ILSError) {
        try await transaction { connection in
            try await Self.insertAudit(connection, actor: actor, action: action, target: target, detail: detail)
        }
    }

    public func auditEntries(since: Int64, before: Int64?, limit: Int, filter: AuditFilter) async throws(ILSError)
        -> [AuditEntry]
    {
        let before = before ?? Int64.max
        let limit = Int64(max(limit, 0))
        let (actor, action, target, prefix) = (filter.actor, filter.exactAction, filter.target, filter.actionPrefix)
        return try await transaction { connection in
            var entries: [AuditEntry] = []
            // As SQLite's: each filter is "unset or equal", and the prefix compares the action's first characters.
            for try await (seq, at, actor, action, target, detail) in try await connection.query(
                """
                SELECT seq, at, actor, action, target, detail FROM audit WHERE at >= \(since) AND seq < \(before)
                AND (\(actor)::text IS NULL OR actor = \(actor)) AND (\(action)::text IS NULL OR action = \(action))
                AND (\(target)::text IS NULL OR target = \(target))
                AND (\(prefix)::text IS NULL OR left(action, length(\(prefix))) = \(prefix))
                ORDER BY seq DESC LIMIT \(limit)
                """,
                logger: Self.quiet
            ).decode((Int64, Int64, String, String, String, String).self) {
                entries.append(
                    AuditEntry(seq: seq, at: at, actor: actor, action: action, target: target, detail: detail)
                )
            }
            return entries.reversed()
        }
    }

    public func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) async throws(ILSError) -> Int {
        var removed = 0
        while true {
            // As SQLite's: both limits become one `seq` bound, and each batch is a primary-key range.
            let count = try await transaction { connection -> Int in
                var newest: Int64 = 0
                for try await value in try await connection.query(
                    "SELECT COALESCE(MAX(seq), 0) FROM audit",
                    logger: Self.quiet
                )
                .decode(Int64.self) {
                    newest = value
                }
                var aged: Int64 = 0
                for try await value in try await connection.query(
                    "SELECT seq FROM audit WHERE at < \(olderThan) ORDER BY at DESC, seq DESC LIMIT 1",
                    logger: Self.quiet
                ).decode(Int64.self) {
                    aged = value
                }
                let bound = max(aged, newest - Int64(keepingAtMost))
                guard bound > 0 else { return 0 }
                var deleted = 0
                for try await _ in try await connection.query(
                    """
                    DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE seq <= \(bound) ORDER BY seq LIMIT \(Int64(batch)))
                    RETURNING seq
                    """,
                    logger: Self.quiet
                ) {
                    deleted += 1
                }
                return deleted
            }
            removed += count
            if count < batch { return removed }
        }
    }

    // MARK: - Controllers

    public func heartbeat(_ member: ControllerMember) async throws(ILSError) {
        try await transaction { connection in
            var inserted = false
            for try await value in try await connection.query(
                """
                INSERT INTO controllers (address, started_at, last_seen_at)
                VALUES (\(member.address), \(member.startedAt), \(member.lastSeenAt))
                ON CONFLICT (address) DO UPDATE SET started_at = excluded.started_at, last_seen_at = excluded.last_seen_at
                RETURNING (xmax = 0)
                """,
                logger: Self.quiet
            ).decode(Bool.self) {
                inserted = value
            }
            // Only a new member is news; a beat of a known one is not worth a notification every 5 seconds.
            if inserted { try await Self.notify(connection, "controllers") }
        }
    }

    public func controllers(seenSince: Int64) async throws(ILSError) -> [ControllerMember] {
        try await transaction { connection in
            var members: [ControllerMember] = []
            for try await (address, started, seen) in try await connection.query(
                "SELECT address, started_at, last_seen_at FROM controllers WHERE last_seen_at >= \(seenSince) ORDER BY address",
                logger: Self.quiet
            ).decode((String, Int64, Int64).self) {
                members.append(ControllerMember(address: address, startedAt: started, lastSeenAt: seen))
            }
            return members
        }
    }

    // MARK: - Migration

    public func exportRecords() async throws(ILSError) -> StoreRecords {
        try await transaction { connection in
            var identities: [StoreRecords.Identity] = []
            for try await row in try await connection.query(
                "SELECT \(unescaped: Self.identityColumns), public_key FROM identities ORDER BY name",
                logger: Self.quiet
            ).decode((String, String, String, String, String, Int64, String?, Int64?, Int64?, String?).self) {
                if let record = Self.identity((row.0, row.1, row.2, row.3, row.4, row.5, row.6, row.7, row.8)) {
                    identities.append(StoreRecords.Identity(record: record, publicKey: row.9))
                }
            }
            var tokens: [TokenRecord] = []
            for try await (jti, id, created, expires, consumed) in try await connection.query(
                "SELECT jti, identity_id, created_at, expires_at, consumed_at FROM enrollment_tokens ORDER BY jti",
                logger: Self.quiet
            ).decode((String, String, Int64, Int64, Int64?).self) {
                tokens.append(
                    TokenRecord(jti: jti, identityID: id, createdAt: created, expiresAt: expires, consumedAt: consumed)
                )
            }
            let services = try await Self.services(connection, where: "ORDER BY name")
            return StoreRecords(identities: identities, tokens: tokens, services: services)
        }
    }

    public func importRecords(_ records: StoreRecords) async throws(ILSError) {
        try await transaction { connection in
            try await connection.query("LOCK TABLE identities IN EXCLUSIVE MODE", logger: Self.quiet)
            var any = false
            for try await _ in try await connection.query("SELECT 1 FROM identities LIMIT 1", logger: Self.quiet) {
                any = true
            }
            guard !any else {
                throw ILSError(.conflict, "the target store already has identities; migrate only into an empty store")
            }
            try await connection.query("DELETE FROM services", logger: Self.quiet)
            for service in records.services {
                guard try await Self.insertService(connection, service) else {
                    throw ILSError(.conflict, "the records name the service '\(service.name)' twice")
                }
            }
            for identity in records.identities {
                let record = identity.record
                let attributes = record.attributes.joined(separator: ",")
                try await connection.query(
                    """
                    INSERT INTO identities (id, name, role, attributes, state, created_at, cert_fingerprint,
                        cert_not_after, public_key, last_seen_at)
                    VALUES (\(record.id), \(record.name), \(record.role.rawValue), \(attributes), \(record.state.rawValue),
                        \(record.createdAt), \(record.certificateFingerprint), \(record.certificateNotAfter),
                        \(identity.publicKey), \(record.lastSeenAt))
                    """,
                    logger: Self.quiet
                )
            }
            for token in records.tokens { try await Self.insertToken(connection, token) }
        }
    }

    public func importAudit(_ entries: [AuditEntry]) async throws(ILSError) {
        guard !entries.isEmpty else { return }
        try await transaction { connection in
            for entry in entries {
                try await connection.query(
                    """
                    INSERT INTO audit (seq, at, actor, action, target, detail)
                    VALUES (\(entry.seq), \(entry.at), \(entry.actor), \(entry.action), \(entry.target), \(entry.detail))
                    """,
                    logger: Self.quiet
                )
            }
            // New rows continue after the copied ones.
            try await connection.query(
                "SELECT setval(pg_get_serial_sequence('audit', 'seq'), (SELECT MAX(seq) FROM audit))",
                logger: Self.quiet
            )
        }
    }

    // MARK: - Change feed

    /// Notifications from every controller's commits. Listens on one connection of the pool; when that connection
    /// is lost, or stops hearing the feed's own probes (`ChangeFeedProbe`), it listens again as soon as the server
    /// answers, and then yields `.resynchronize`, since anything committed meanwhile was not heard.
    public func changes() -> AsyncStream<StoreChange> {
        let feed = PostgresChangeFeed(
            client: client,
            logger: logger,
            description: description,
            probe: feedProbe,
            ping: { [weak self] payload throws(ILSError) in
                guard let self else { throw ILSError(.unavailable, "the store is closed") }
                try await self.transaction { connection in try await Self.notify(connection, payload) }
            }
        )
        return AsyncStream(bufferingPolicy: .bufferingNewest(1024)) { continuation in
            let listener = Task { await feed.run(into: continuation) }
            continuation.onTermination = { _ in listener.cancel() }
        }
    }

    /// `identity:ID`, `services` or `controllers`; anything else (or longer than an id can be) is ignored.
    static func change(_ payload: String) -> StoreChange? {
        guard payload.utf8.count <= 200 else { return nil }
        if payload == "services" { return .services }
        if payload == "controllers" { return .controllers }
        if payload.hasPrefix("identity:") {
            let id = String(payload.dropFirst("identity:".count))
            guard !id.isEmpty else { return nil }
            return .identity(id: id)
        }
        return nil
    }
}
