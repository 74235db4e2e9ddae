import Foundation
import ILSCore

/// Column lists and row decoding: a row that does not decode (an unknown role or state, a missing column) is skipped
/// on every backend.
enum StoreRows {
    static let identityColumns: StoreSQL =
        "id, name, role, attributes, state, created_at, cert_fingerprint, cert_not_after, last_seen_at"
    static let serviceColumns: StoreSQL = "name, dial_roles, bind_roles, dial_policy, bind_policy, revision"
    static let tokenColumns: StoreSQL = "jti, identity_id, created_at, expires_at, consumed_at"
    static let controllerColumns: StoreSQL = "address, started_at, last_seen_at"

    static func identity(_ row: some Collection<StoreValue>) -> IdentityRecord? {
        let row = Array(row)
        guard row.count >= 9, let id = row[0].text, let name = row[1].text,
            let role = row[2].text.flatMap(IdentityRole.init(rawValue:)),
            let state = row[4].text.flatMap(IdentityState.init(rawValue:)), let createdAt = row[5].integer
        else { return nil }
        return IdentityRecord(
            id: id,
            name: name,
            role: role,
            attributes: (row[3].text ?? "").split(separator: ",").map(String.init),
            state: state,
            createdAt: createdAt,
            certificateFingerprint: row[6].text,
            certificateNotAfter: row[7].integer,
            lastSeenAt: row[8].integer
        )
    }

    static func service(_ row: [StoreValue]) -> ServiceRecord? {
        guard row.count == 6, let name = row[0].text, let revision = row[5].integer else { return nil }
        return ServiceRecord(
            name: name,
            dial: ServiceRecord.storedPolicy(json: row[3].text, roles: row[1].text ?? ""),
            bind: ServiceRecord.storedPolicy(json: row[4].text, roles: row[2].text ?? ""),
            revision: revision
        )
    }

    static func token(_ row: [StoreValue]) -> TokenRecord? {
        guard row.count == 5, let jti = row[0].text, let id = row[1].text, let created = row[2].integer,
            let expires = row[3].integer
        else { return nil }
        return TokenRecord(jti: jti, identityID: id, createdAt: created, expiresAt: expires, consumedAt: row[4].integer)
    }

    static func controller(_ row: [StoreValue]) -> ControllerMember? {
        guard row.count == 3, let address = row[0].text, let started = row[1].integer, let seen = row[2].integer
        else { return nil }
        return ControllerMember(address: address, startedAt: started, lastSeenAt: seen)
    }

    static func auditEntry(_ row: [StoreValue]) -> AuditEntry? {
        guard row.count == 6, let seq = row[0].integer, let at = row[1].integer else { return nil }
        return AuditEntry(
            seq: seq,
            at: at,
            actor: row[2].text ?? "",
            action: row[3].text ?? "",
            target: row[4].text ?? "",
            detail: row[5].text ?? ""
        )
    }

    static var now: Int64 { Int64(Date().timeIntervalSince1970) }
}

/// The statements more than one rule writes.
extension StoreTransaction {
    /// The identity `column` = `value` names, locked for the rest of the transaction when `locked`.
    func identity(where column: StoreSQL, is value: String, locked: Bool = false) async throws(ILSError)
        -> IdentityRecord?
    {
        let lock = locked ? lockClause : ""
        return try await query(
            "SELECT \(StoreRows.identityColumns) FROM identities WHERE \(column) = ?\(lock)",
            [.text(value)]
        ).first.flatMap(StoreRows.identity)
    }

    func service(named name: String, locked: Bool = false) async throws(ILSError) -> ServiceRecord? {
        let lock = locked ? lockClause : ""
        return try await query(
            "SELECT \(StoreRows.serviceColumns) FROM services WHERE name = ?\(lock)",
            [.text(name)]
        ).first.flatMap(StoreRows.service)
    }

    /// Every audit row goes through here: what a peer chose (a name, a service, a sentence quoting them) is kept
    /// escaped and bounded (`AuditLimits`), whichever caller passed it.
    func insertAudit(actor: String, action: String, target: String, detail: String) async throws(ILSError) {
        try await execute(
            "INSERT INTO audit (at, actor, action, target, detail) VALUES (?, ?, ?, ?, ?)",
            [
                .integer(StoreRows.now),
                .text(ControlCharacters.bounded(actor, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(action, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(target, limit: AuditLimits.field)),
                .text(ControlCharacters.bounded(detail, limit: AuditLimits.detail)),
            ]
        )
    }

    /// A token as it is: outstanding when new, possibly consumed when imported.
    func insertToken(_ token: TokenRecord) async throws(ILSError) {
        try await execute(
            "INSERT INTO enrollment_tokens (\(StoreRows.tokenColumns)) VALUES (?, ?, ?, ?, ?)",
            [
                .text(token.jti), .text(token.identityID), .integer(token.createdAt), .integer(token.expiresAt),
                .integerOrNull(token.consumedAt),
            ]
        )
    }

    /// Inserts `service` with both the policies' JSON and the roles columns an earlier release reads; false when
    /// the name is taken.
    func insertService(_ service: ServiceRecord) async throws(ILSError) -> Bool {
        try await execute(
            """
            INSERT INTO services (name, dial_roles, bind_roles, dial_policy, bind_policy, revision, created_at)
            VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING
            """,
            [
                .text(service.name), .text(ServiceRecord.legacyColumn(service.dial)),
                .text(ServiceRecord.legacyColumn(service.bind)), .text(ServiceRecord.storedJSON(service.dial)),
                .text(ServiceRecord.storedJSON(service.bind)), .integer(service.revision), .integer(StoreRows.now),
            ]
        ) == 1
    }
}
