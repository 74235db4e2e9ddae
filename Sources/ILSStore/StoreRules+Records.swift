public import ILSCore

/// Rows per INSERT when audit rows are copied: 6 values each, far below SQLite's 32,766 and PostgreSQL's 65,535.
private let auditRowsPerInsert = 100

/// The audit log, the controller list and `controller migrate`'s records, for every backend.
extension SQLBackedStore {
    public func audit(actor: String, action: String, target: String, detail: String) async throws(ILSError) {
        try await backend.run(.write) { tx throws(ILSError) in
            try await tx.insertAudit(actor: actor, action: action, target: target, detail: detail)
        }
    }

    public func auditEntries(since: Int64, before: Int64?, limit: Int, filter: AuditFilter) async throws(ILSError)
        -> [AuditEntry]
    {
        // Each filter is "unset or equal"; the prefix compares the action's first characters (no LIKE, so '_' and
        // '%' in a filter mean themselves). A NULL bound to `?` has no type on PostgreSQL, hence the casts.
        var binds: [StoreValue] = [.integer(since), .integer(before ?? Int64.max)]
        for value in [filter.actor, filter.exactAction, filter.target] {
            binds += [.textOrNull(value), .textOrNull(value)]
        }
        let prefix = filter.actionPrefix
        binds += [.textOrNull(prefix), .textOrNull(prefix), .textOrNull(prefix), .integer(Int64(max(limit, 0)))]
        return try await backend.run(.read) { [binds] tx throws(ILSError) -> [AuditEntry] in
            try await tx.query(
                """
                SELECT seq, at, actor, action, target, detail FROM audit WHERE at >= ? AND seq < ?
                AND (CAST(? AS TEXT) IS NULL OR actor = ?) AND (CAST(? AS TEXT) IS NULL OR action = ?)
                AND (CAST(? AS TEXT) IS NULL OR target = ?)
                AND (CAST(? AS TEXT) IS NULL OR substr(action, 1, length(CAST(? AS TEXT))) = ?)
                ORDER BY seq DESC LIMIT ?
                """,
                binds
            ).reversed().compactMap(StoreRows.auditEntry)
        }
    }

    public func pruneAudit(olderThan: Int64, keepingAtMost: Int, batch: Int) async throws(ILSError) -> Int {
        var removed = 0
        while true {
            // One short transaction per batch: an admin's write or an enrollment waits for one batch at most. Both
            // limits become one `seq` bound (entries are appended in time order), so each batch is a range of the
            // primary key and a pass with nothing to prune reads two index entries, not the log (1,000,000 rows on
            // SQLite: 42 ms holding the write lock with a scan, 0.1 ms this way).
            let count = try await backend.run(.write) { tx throws(ILSError) -> Int in
                let newest = try await tx.query("SELECT COALESCE(MAX(seq), 0) FROM audit").first?.first?.integer ?? 0
                // The newest entry past the age, found in the `at` index (MAX(seq) ... WHERE at < ? scans the log).
                let aged =
                    try await tx.query(
                        "SELECT seq FROM audit WHERE at < ? ORDER BY at DESC, seq DESC LIMIT 1",
                        [.integer(olderThan)]
                    ).first?.first?.integer ?? 0
                let bound = max(aged, newest - Int64(keepingAtMost))
                guard bound > 0 else { return 0 }
                return try await tx.execute(
                    "DELETE FROM audit WHERE seq IN (SELECT seq FROM audit WHERE seq <= ? ORDER BY seq LIMIT ?)",
                    [.integer(bound), .integer(Int64(batch))]
                )
            }
            removed += count
            if count < batch { return removed }
        }
    }

    public func heartbeat(_ member: ControllerMember) async throws(ILSError) {
        try await backend.run(.write) { tx throws(ILSError) in
            let known = try await tx.query("SELECT 1 FROM controllers WHERE address = ?", [.text(member.address)])
            try await tx.execute(
                """
                INSERT INTO controllers (\(StoreRows.controllerColumns)) VALUES (?, ?, ?)
                ON CONFLICT (address) DO UPDATE
                    SET started_at = excluded.started_at, last_seen_at = excluded.last_seen_at
                """,
                [.text(member.address), .integer(member.startedAt), .integer(member.lastSeenAt)]
            )
            // Only a new member is news; a beat of a known one is not worth a notification every 5 seconds. Two
            // first beats racing may both announce it, which costs one more reading of the list.
            if known.isEmpty { try await tx.notify(.controllers) }
        }
    }

    public func controllers(seenSince: Int64) async throws(ILSError) -> [ControllerMember] {
        try await backend.run(.read) { tx throws(ILSError) in
            try await tx.query(
                """
                SELECT \(StoreRows.controllerColumns) FROM controllers WHERE last_seen_at >= ?
                ORDER BY address\(tx.byteOrder)
                """,
                [.integer(seenSince)]
            ).compactMap(StoreRows.controller)
        }
    }

    public func exportRecords() async throws(ILSError) -> StoreRecords {
        try await backend.run(.snapshot) { tx throws(ILSError) -> StoreRecords in
            let identities = try await tx.query(
                "SELECT \(StoreRows.identityColumns), public_key FROM identities ORDER BY name\(tx.byteOrder)"
            ).compactMap { row -> StoreRecords.Identity? in
                guard let record = StoreRows.identity(row.prefix(9)) else { return nil }
                return StoreRecords.Identity(record: record, publicKey: row[9].text)
            }
            let tokens = try await tx.query(
                "SELECT \(StoreRows.tokenColumns) FROM enrollment_tokens ORDER BY jti\(tx.byteOrder)"
            ).compactMap(StoreRows.token)
            let services = try await tx.query(
                "SELECT \(StoreRows.serviceColumns) FROM services ORDER BY name\(tx.byteOrder)"
            ).compactMap(StoreRows.service)
            return StoreRecords(identities: identities, tokens: tokens, services: services)
        }
    }

    public func importRecords(_ records: StoreRecords) async throws(ILSError) {
        try await backend.run(.write) { tx throws(ILSError) in
            try await tx.lockTable("identities")
            guard try await tx.query("SELECT 1 FROM identities LIMIT 1").isEmpty else {
                throw ILSError(.conflict, "the target store already has identities; migrate only into an empty store")
            }
            // A fresh store has the default service; the imported list replaces it.
            try await tx.execute("DELETE FROM services")
            for service in records.services {
                guard try await tx.insertService(service) else {
                    throw ILSError(.conflict, "the records name the service '\(service.name)' twice")
                }
            }
            for identity in records.identities {
                let record = identity.record
                try await tx.execute(
                    """
                    INSERT INTO identities (id, name, role, attributes, state, created_at, cert_fingerprint,
                        cert_not_after, public_key, last_seen_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                    """,
                    [
                        .text(record.id), .text(record.name), .text(record.role.rawValue),
                        .text(record.attributes.joined(separator: ",")), .text(record.state.rawValue),
                        .integer(record.createdAt), .textOrNull(record.certificateFingerprint),
                        .integerOrNull(record.certificateNotAfter), .textOrNull(identity.publicKey),
                        .integerOrNull(record.lastSeenAt),
                    ]
                )
            }
            for token in records.tokens { try await tx.insertToken(token) }
        }
    }

    public func importAudit(_ entries: [AuditEntry]) async throws(ILSError) {
        guard !entries.isEmpty else { return }
        try await backend.run(.write) { tx throws(ILSError) in
            // Many rows per statement: a page of 1,000 was 1,000 round trips to PostgreSQL, which a loaded machine
            // stretched past the call's 10 s bound.
            var start = entries.startIndex
            while start < entries.endIndex {
                let rows = entries[start..<min(start + auditRowsPerInsert, entries.endIndex)]
                let values = StoreSQL.repeating("(?, ?, ?, ?, ?, ?)", count: rows.count, separator: ", ")
                try await tx.execute(
                    "INSERT INTO audit (seq, at, actor, action, target, detail) VALUES \(values)",
                    // Verbatim: the source store bounded and escaped them when they were written.
                    rows.flatMap { entry -> [StoreValue] in
                        [
                            .integer(entry.seq), .integer(entry.at), .text(entry.actor), .text(entry.action),
                            .text(entry.target), .text(entry.detail),
                        ]
                    }
                )
                start = rows.endIndex
            }
            try await tx.auditSequenceFollowsImport()
        }
    }
}
