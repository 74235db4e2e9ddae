import Foundation
public import ILSCore

#if canImport(Glibc)
import Glibc
#endif

/// The embedded store's transactions, synchronous: one SQLite file in WAL mode with versioned migrations.
/// `SQLiteControllerStore` runs each on NIO's blocking-I/O pool, never on an event loop.
final class SQLiteStoreTransactions: Sendable {
    private let database: SQLiteDatabase

    /// Each entry upgrades the schema by one version (`PRAGMA user_version`); never edit a shipped entry.
    private static let migrations: [[String]] = [
        [
            """
            CREATE TABLE identities (
                id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL, attributes TEXT NOT NULL,
                state TEXT NOT NULL, created_at INTEGER NOT NULL, cert_fingerprint TEXT, cert_not_after INTEGER,
                public_key TEXT, last_seen_at INTEGER)
            """,
            """
            CREATE TABLE enrollment_tokens (
                jti TEXT PRIMARY KEY, identity_id TEXT NOT NULL REFERENCES identities(id) ON DELETE CASCADE,
                created_at INTEGER NOT NULL, expires_at INTEGER NOT NULL, consumed_at INTEGER)
            """,
            "CREATE INDEX enrollment_tokens_identity ON enrollment_tokens(identity_id)",
            """
            CREATE TABLE services (
                name TEXT PRIMARY KEY, dial_roles TEXT NOT NULL, bind_roles TEXT NOT NULL, created_at INTEGER NOT NULL)
            """,
            """
            CREATE TABLE audit (
                seq INTEGER PRIMARY KEY AUTOINCREMENT, at INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
                target TEXT NOT NULL, detail TEXT NOT NULL)
            """,
        ],
        // Retention deletes by age; without an index on `at` each pass would scan the whole log.
        ["CREATE INDEX audit_at ON audit(at)"],
        [
            """
            CREATE TABLE controllers (
                address TEXT PRIMARY KEY, started_at INTEGER NOT NULL, last_seen_at INTEGER NOT NULL)
            """
        ],
        // Services and policies: the policies as JSON (NULL in a row an earlier release wrote, which then means its
        // roles columns, still written for that release) and a revision for updates.
        [
            "ALTER TABLE services ADD COLUMN dial_policy TEXT",
            "ALTER TABLE services ADD COLUMN bind_policy TEXT",
            "ALTER TABLE services ADD COLUMN revision INTEGER NOT NULL DEFAULT 1",
        ],
    ]

    /// Opens (creating if needed) the store at `path`; `SQLiteControllerStore.inMemory` is a private store that
    /// lives as long as this object, for tests and fuzzing.
    init(path: String) throws(ILSError) {
        if path != SQLiteControllerStore.inMemory {
            // Create the file owner-only before SQLite does (it would use 0644); its -wal and -shm files copy the mode.
            let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
            if fd >= 0 { close(fd) }
        }
        database = try SQLiteDatabase(path: path)
        try migrate()
    }

    private func migrate() throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            let version = try database.query("PRAGMA user_version").first?.first?.integer ?? 0
            guard version <= Int64(Self.migrations.count) else {
                throw ILSError(
                    .invalidInput,
                    "the store \(database.path) was written by a newer ils-gateway (schema \(version)); upgrade first"
                )
            }
            for migration in Self.migrations.dropFirst(Int(version)) {
                for statement in migration { try database.execute(statement) }
            }
            try database.execute("PRAGMA user_version = \(Self.migrations.count)")
        }
    }

    private static let identityColumns =
        "id, name, role, attributes, state, created_at, cert_fingerprint, cert_not_after, last_seen_at"

    private static func identity(from row: [SQLiteValue]) -> IdentityRecord? {
        guard row.count == 9, let id = row[0].text, let name = row[1].text,
            let role = row[2].text.flatMap(IdentityRole.init(rawValue:)),
            let state = row[4].text.flatMap(IdentityState.init(rawValue:)), let createdAt = row[5].integer
        else { return nil }
        let attributes = (row[3].text ?? "").split(separator: ",").map(String.init)
        return IdentityRecord(
            id: id,
            name: name,
            role: role,
            attributes: attributes,
            state: state,
            createdAt: createdAt,
            certificateFingerprint: row[6].text,
            certificateNotAfter: row[7].integer,
            lastSeenAt: row[8].integer
        )
    }

    func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            guard try database.query("SELECT 1 FROM identities WHERE name = ?", [.text(identity.name)]).isEmpty else {
                throw ILSError(.conflict, "an identity named '\(identity.name)' already exists")
            }
            try database.execute(
                "INSERT INTO identities (id, name, role, attributes, state, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                [
                    .text(identity.id), .text(identity.name), .text(identity.role.rawValue),
                    .text(identity.attributes.joined(separator: ",")), .text(identity.state.rawValue),
                    .integer(identity.createdAt),
                ]
            )
            try insertToken(token)
            try insertAudit(
                actor: actor,
                action: "identity.create",
                target: identity.name,
                detail: "role=\(identity.role.rawValue)"
            )
        }
    }

    private func insertToken(_ token: TokenRecord) throws(ILSError) {
        try database.execute(
            "INSERT INTO enrollment_tokens (jti, identity_id, created_at, expires_at) VALUES (?, ?, ?, ?)",
            [.text(token.jti), .text(token.identityID), .integer(token.createdAt), .integer(token.expiresAt)]
        )
    }

    /// Every audit row goes through here: what a peer chose (a name, a service, a sentence quoting them) is kept
    /// escaped and bounded (`AuditLimits`), whichever caller passed it.
    private func insertAudit(actor: String, action: String, target: String, detail: String) throws(ILSError) {
        try database.execute(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
            [
                .integer(Int64(Date().timeIntervalSince1970)),
                .text(ControlCharacters.bounded(actor, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(action, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(target, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(detail, limit: AuditLimits.detail)),
            ]
        )
    }

    func identity(named name: String) throws(ILSError) -> IdentityRecord? {
        try database.withConnection { () throws(ILSError) in
            try database.query("SELECT \(Self.identityColumns) FROM identities WHERE name = ?", [.text(name)])
                .first.flatMap(Self.identity(from:))
        }
    }

    func identity(id: String) throws(ILSError) -> IdentityRecord? {
        try database.withConnection { () throws(ILSError) in
            try database.query("SELECT \(Self.identityColumns) FROM identities WHERE id = ?", [.text(id)])
                .first.flatMap(Self.identity(from:))
        }
    }

    func identities() throws(ILSError) -> [IdentityRecord] {
        try database.withConnection { () throws(ILSError) in
            try database.query("SELECT \(Self.identityColumns) FROM identities ORDER BY name")
                .compactMap(Self.identity(from:))
        }
    }

    func deleteIdentity(named name: String, actor: String) throws(ILSError) -> IdentityRecord? {
        try database.transaction { () throws(ILSError) -> IdentityRecord? in
            guard
                let record = try database.query(
                    "SELECT \(Self.identityColumns) FROM identities WHERE name = ?",
                    [.text(name)]
                ).first.flatMap(Self.identity(from:))
            else { return nil }
            try database.execute("DELETE FROM identities WHERE id = ?", [.text(record.id)])
            try insertAudit(actor: actor, action: "identity.delete", target: name, detail: "")
            return record
        }
    }

    func replaceToken(_ token: TokenRecord, actor: String) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            try database.execute(
                "DELETE FROM enrollment_tokens WHERE identity_id = ? AND consumed_at IS NULL",
                [.text(token.identityID)]
            )
            try insertToken(token)
            let name =
                try database.query("SELECT name FROM identities WHERE id = ?", [.text(token.identityID)])
                .first?.first?.text ?? token.identityID
            try insertAudit(actor: actor, action: "identity.reissue", target: name, detail: "")
        }
    }

    func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        throws(ILSError) -> IdentityRecord
    {
        try database.transaction { () throws(ILSError) -> IdentityRecord in
            guard
                let row = try database.query(
                    "SELECT identity_id, expires_at, consumed_at FROM enrollment_tokens WHERE jti = ?",
                    [.text(jti)]
                ).first, row[0].text == identityID
            else { throw EnrollmentRefusal.unknown.error }
            guard row[2] == .null else { throw EnrollmentRefusal.used.error }
            guard let expiresAt = row[1].integer, now < expiresAt else { throw EnrollmentRefusal.expired.error }
            let consumed = try database.execute(
                "UPDATE enrollment_tokens SET consumed_at = ? WHERE jti = ? AND consumed_at IS NULL",
                [.integer(now), .text(jti)]
            )
            guard consumed == 1 else { throw EnrollmentRefusal.used.error }
            let updated = try database.execute(
                """
                UPDATE identities SET state = CASE state WHEN 'pending' THEN 'active' ELSE state END,
                    cert_fingerprint = ?, cert_not_after = ?, public_key = ?, last_seen_at = ?
                WHERE id = ? AND state IN ('pending', 'active', 'disabled')
                """,
                [
                    .text(certificate.fingerprint), .integer(certificate.notAfter), .text(certificate.publicKey),
                    .integer(now), .text(identityID),
                ]
            )
            guard updated == 1,
                let record = try database.query(
                    "SELECT \(Self.identityColumns) FROM identities WHERE id = ?",
                    [.text(identityID)]
                ).first.flatMap(Self.identity(from:))
            else { throw EnrollmentRefusal.unknown.error }
            try insertAudit(
                actor: record.name,
                action: "identity.enroll",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            return record
        }
    }

    func changeState(named name: String, to target: IdentityState, actor: String) throws(ILSError)
        -> IdentityRecord
    {
        try database.transaction { () throws(ILSError) -> IdentityRecord in
            guard
                let current = try database.query(
                    "SELECT \(Self.identityColumns) FROM identities WHERE name = ?",
                    [.text(name)]
                ).first.flatMap(Self.identity(from:))
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
            try database.execute(
                "UPDATE identities SET state = ? WHERE id = ?",
                [.text(target.rawValue), .text(current.id)]
            )
            if target == .revoked {
                // A revoked identity can never enroll again: its outstanding tokens go too.
                try database.execute("DELETE FROM enrollment_tokens WHERE identity_id = ?", [.text(current.id)])
            }
            let action =
                target == .revoked ? "identity.revoke" : target == .disabled ? "identity.disable" : "identity.enable"
            try insertAudit(actor: actor, action: action, target: name, detail: "")
            var updated = current
            updated.state = target
            return updated
        }
    }

    func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        throws(ILSError) -> IdentityRecord
    {
        try database.transaction { () throws(ILSError) -> IdentityRecord in
            let updated = try database.execute(
                """
                UPDATE identities SET cert_fingerprint = ?, cert_not_after = ?, public_key = ?, last_seen_at = ?
                WHERE id = ? AND cert_fingerprint = ? AND state = 'active'
                """,
                [
                    .text(certificate.fingerprint), .integer(certificate.notAfter), .text(certificate.publicKey),
                    .integer(now), .text(id), .text(previousFingerprint),
                ]
            )
            guard updated == 1,
                let record = try database.query(
                    "SELECT \(Self.identityColumns) FROM identities WHERE id = ?",
                    [.text(id)]
                ).first.flatMap(Self.identity(from:))
            else { throw ILSError(.conflict, "the certificate was already renewed or replaced") }
            try insertAudit(
                actor: record.name,
                action: "identity.renew",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            return record
        }
    }

    func recordLastSeen(_ times: [String: Int64]) throws(ILSError) {
        guard !times.isEmpty else { return }
        try database.transaction { () throws(ILSError) in
            for (id, time) in times.sorted(by: { $0.key < $1.key }) {
                try database.execute(
                    "UPDATE identities SET last_seen_at = ? WHERE id = ? AND (last_seen_at IS NULL OR last_seen_at < ?)",
                    [.integer(time), .text(id), .integer(time)]
                )
            }
        }
    }

    private static let serviceColumns = "name, dial_roles, bind_roles, dial_policy, bind_policy, revision"

    private static func service(from row: [SQLiteValue]) -> ServiceRecord? {
        guard row.count == 6, let name = row[0].text, let revision = row[5].integer else { return nil }
        return ServiceRecord(
            name: name,
            dial: ServiceRecord.storedPolicy(json: row[3].text, roles: row[1].text ?? ""),
            bind: ServiceRecord.storedPolicy(json: row[4].text, roles: row[2].text ?? ""),
            revision: revision
        )
    }

    func services() throws(ILSError) -> [ServiceRecord] {
        try database.withConnection { () throws(ILSError) in
            try database.query("SELECT \(Self.serviceColumns) FROM services ORDER BY name")
                .compactMap(Self.service(from:))
        }
    }

    func service(named name: String) throws(ILSError) -> ServiceRecord? {
        try database.withConnection { () throws(ILSError) -> ServiceRecord? in
            try storedService(named: name)
        }
    }

    private func storedService(named name: String) throws(ILSError) -> ServiceRecord? {
        try database.query("SELECT \(Self.serviceColumns) FROM services WHERE name = ?", [.text(name)])
            .first.flatMap(Self.service(from:))
    }

    private func insertService(_ service: ServiceRecord, createdAt: Int64) throws(ILSError) {
        try database.execute(
            """
            INSERT INTO services (name, dial_roles, bind_roles, dial_policy, bind_policy, revision, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """,
            [
                .text(service.name), .text(ServiceRecord.legacyColumn(service.dial)),
                .text(ServiceRecord.legacyColumn(service.bind)), .text(ServiceRecord.storedJSON(service.dial)),
                .text(ServiceRecord.storedJSON(service.bind)), .integer(service.revision), .integer(createdAt),
            ]
        )
    }

    func createService(_ service: ServiceRecord, actor: String) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            guard try database.query("SELECT 1 FROM services WHERE name = ?", [.text(service.name)]).isEmpty else {
                throw ILSError(.conflict, "a service named '\(service.name)' already exists")
            }
            var created = service
            created.revision = 1
            try insertService(created, createdAt: Int64(Date().timeIntervalSince1970))
            try insertAudit(
                actor: actor,
                action: "service.create",
                target: service.name,
                detail: ServiceAudit.created(created)
            )
        }
    }

    func updateService(_ service: ServiceRecord, expectedRevision: Int64, actor: String) throws(ILSError)
        -> ServiceRecord
    {
        try database.transaction { () throws(ILSError) -> ServiceRecord in
            guard let current = try storedService(named: service.name) else {
                throw ILSError(.notFound, "no service named '\(service.name)'")
            }
            guard current.revision == expectedRevision else { throw ServiceAudit.stale(service.name) }
            var updated = service
            updated.revision = current.revision + 1
            try database.execute(
                """
                UPDATE services SET dial_roles = ?, bind_roles = ?, dial_policy = ?, bind_policy = ?, revision = ?
                WHERE name = ?
                """,
                [
                    .text(ServiceRecord.legacyColumn(updated.dial)), .text(ServiceRecord.legacyColumn(updated.bind)),
                    .text(ServiceRecord.storedJSON(updated.dial)), .text(ServiceRecord.storedJSON(updated.bind)),
                    .integer(updated.revision), .text(updated.name),
                ]
            )
            try insertAudit(
                actor: actor,
                action: "service.update",
                target: service.name,
                detail: ServiceAudit.updated(from: current, to: updated)
            )
            return updated
        }
    }

    func deleteService(named name: String, actor: String) throws(ILSError) -> ServiceRecord? {
        try database.transaction { () throws(ILSError) -> ServiceRecord? in
            guard let current = try storedService(named: name) else { return nil }
            try database.execute("DELETE FROM services WHERE name = ?", [.text(name)])
            try insertAudit(actor: actor, action: "service.delete", target: name, detail: ServiceAudit.created(current))
            return current
        }
    }

    func updateAttributes(named name: String, attributes: [String], actor: String) throws(ILSError) -> IdentityRecord {
        try database.transaction { () throws(ILSError) -> IdentityRecord in
            guard
                var record = try database.query(
                    "SELECT \(Self.identityColumns) FROM identities WHERE name = ?",
                    [.text(name)]
                ).first.flatMap(Self.identity(from:))
            else { throw ILSError(.notFound, "no identity named '\(name)'") }
            let before = record.attributes
            record.attributes = attributes
            try database.execute(
                "UPDATE identities SET attributes = ? WHERE id = ?",
                [.text(attributes.joined(separator: ",")), .text(record.id)]
            )
            try insertAudit(
                actor: actor,
                action: "identity.attributes",
                target: name,
                detail: ServiceAudit.attributes(from: before, to: attributes)
            )
            return record
        }
    }

    func audit(actor: String, action: String, target: String, detail: String) throws(ILSError) {
        try database.withConnection { () throws(ILSError) in
            try insertAudit(actor: actor, action: action, target: target, detail: detail)
        }
    }

    func auditEntries(since: Int64, before: Int64?, limit: Int, filter: AuditFilter) throws(ILSError) -> [AuditEntry] {
        func text(_ value: String?) -> SQLiteValue { value.map { .text($0) } ?? .null }
        let prefix = filter.actionPrefix
        // Each filter is "unset or equal"; the prefix compares the action's first bytes (no LIKE, so '_' and '%' in
        // a filter mean themselves).
        return try database.withConnection { () throws(ILSError) in
            try database.query(
                """
                SELECT seq, at, actor, action, target, detail FROM audit WHERE at >= ? AND seq < ?
                AND (?3 IS NULL OR actor = ?3) AND (?4 IS NULL OR action = ?4) AND (?5 IS NULL OR target = ?5)
                AND (?6 IS NULL OR substr(action, 1, length(?6)) = ?6)
                ORDER BY seq DESC LIMIT ?7
                """,
                [
                    .integer(since), .integer(before ?? Int64.max), text(filter.actor), text(filter.exactAction),
                    text(filter.target), text(prefix), .integer(Int64(max(limit, 0))),
                ]
            ).reversed().map { row in
                AuditEntry(
                    seq: row[0].integer ?? 0,
                    at: row[1].integer ?? 0,
                    actor: row[2].text ?? "",
                    action: row[3].text ?? "",
                    target: row[4].text ?? "",
                    detail: row[5].text ?? ""
                )
            }
        }
    }

    func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) throws(ILSError) -> Int {
        var removed = 0
        while true {
            // One short transaction per batch: an admin's write or an enrollment waits for one batch at most. Both
            // limits become one `seq` bound (entries are appended in time order), so each batch is a range of the
            // primary key and a pass with nothing to prune reads two index entries, not the log (1,000,000 rows:
            // 42 ms holding the write lock with a scan, 0.1 ms this way).
            let count = try database.transaction { () throws(ILSError) -> Int in
                let newest = try database.query("SELECT MAX(seq) FROM audit").first?.first?.integer ?? 0
                // The newest entry past the age, found in the `at` index (MAX(seq) ... WHERE at < ? scans the log).
                let aged =
                    try database.query(
                        "SELECT seq FROM audit WHERE at < ? ORDER BY at DESC, seq DESC LIMIT 1",
                        [.integer(olderThan)]
                    ).first?.first?.integer ?? 0
                let bound = max(aged, newest - Int64(keepingAtMost))
                guard bound > 0 else { return 0 }
                return try database.execute(
                    "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE seq <= ? ORDER BY seq LIMIT ?)",
                    [.integer(bound), .integer(Int64(batch))]
                )
            }
            removed += count
            if count < batch { return removed }
        }
    }

    func heartbeat(_ member: ControllerMember) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            try database.execute(
                """
                INSERT INTO controllers (address, started_at, last_seen_at) VALUES (?, ?, ?)
                ON CONFLICT(address) DO UPDATE SET started_at = excluded.started_at, last_seen_at = excluded.last_seen_at
                """,
                [.text(member.address), .integer(member.startedAt), .integer(member.lastSeenAt)]
            )
        }
    }

    func controllers(seenSince: Int64) throws(ILSError) -> [ControllerMember] {
        try database.withConnection { () throws(ILSError) in
            try database.query(
                "SELECT address, started_at, last_seen_at FROM controllers WHERE last_seen_at >= ? ORDER BY address",
                [.integer(seenSince)]
            ).compactMap { row in
                guard let address = row[0].text, let started = row[1].integer, let seen = row[2].integer else {
                    return nil
                }
                return ControllerMember(address: address, startedAt: started, lastSeenAt: seen)
            }
        }
    }

    func exportRecords() throws(ILSError) -> StoreRecords {
        try database.transaction { () throws(ILSError) -> StoreRecords in
            let identities = try database.query(
                "SELECT \(Self.identityColumns), public_key FROM identities ORDER BY name"
            ).compactMap { row -> StoreRecords.Identity? in
                guard let record = Self.identity(from: Array(row.prefix(9))) else { return nil }
                return StoreRecords.Identity(record: record, publicKey: row[9].text)
            }
            let tokens = try database.query(
                "SELECT jti, identity_id, created_at, expires_at, consumed_at FROM enrollment_tokens ORDER BY jti"
            ).compactMap { row -> TokenRecord? in
                guard let jti = row[0].text, let id = row[1].text, let created = row[2].integer,
                    let expires = row[3].integer
                else { return nil }
                return TokenRecord(
                    jti: jti,
                    identityID: id,
                    createdAt: created,
                    expiresAt: expires,
                    consumedAt: row[4].integer
                )
            }
            let services = try database.query("SELECT \(Self.serviceColumns) FROM services ORDER BY name")
                .compactMap(Self.service(from:))
            return StoreRecords(identities: identities, tokens: tokens, services: services)
        }
    }

    func importRecords(_ records: StoreRecords) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            guard try database.query("SELECT 1 FROM identities LIMIT 1").isEmpty else {
                throw ILSError(.conflict, "the target store already has identities; migrate only into an empty store")
            }
            // A fresh store has the default service; the imported list replaces it.
            try database.execute("DELETE FROM services")
            for service in records.services {
                try insertService(service, createdAt: Int64(Date().timeIntervalSince1970))
            }
            for identity in records.identities {
                let record = identity.record
                try database.execute(
                    """
                    INSERT INTO identities (id, name, role, attributes, state, created_at, cert_fingerprint,
                        cert_not_after, public_key, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [
                        .text(record.id), .text(record.name), .text(record.role.rawValue),
                        .text(record.attributes.joined(separator: ",")), .text(record.state.rawValue),
                        .integer(record.createdAt), record.certificateFingerprint.map(SQLiteValue.text) ?? .null,
                        record.certificateNotAfter.map(SQLiteValue.integer) ?? .null,
                        identity.publicKey.map(SQLiteValue.text) ?? .null,
                        record.lastSeenAt.map(SQLiteValue.integer) ?? .null,
                    ]
                )
            }
            for token in records.tokens {
                try database.execute(
                    """
                    INSERT INTO enrollment_tokens (jti, identity_id, created_at, expires_at, consumed_at)
                    VALUES (?, ?, ?, ?, ?)
                    """,
                    [
                        .text(token.jti), .text(token.identityID), .integer(token.createdAt),
                        .integer(token.expiresAt), token.consumedAt.map(SQLiteValue.integer) ?? .null,
                    ]
                )
            }
        }
    }

    func importAudit(_ entries: [AuditEntry]) throws(ILSError) {
        try database.transaction { () throws(ILSError) in
            for entry in entries {
                try database.execute(
                    "INSERT INTO audit (seq, at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?, ?)",
                    [
                        // Verbatim: the source store bounded and escaped them when they were written.
                        .integer(entry.seq), .integer(entry.at), .text(entry.actor), .text(entry.action),
                        .text(entry.target), .text(entry.detail),
                    ]
                )
            }
        }
    }

    /// `PRAGMA integrity_check`, for operators and fault tests.
    func integrityCheck() throws(ILSError) -> Bool {
        try database.withConnection { () throws(ILSError) in
            try database.query("PRAGMA integrity_check").first?.first?.text == "ok"
        }
    }
}
