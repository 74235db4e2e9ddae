public import ILSCore

/// Identities and their tokens, for every backend. Lock order, wherever a transaction writes both: the identity's
/// row first, then its tokens' (on PostgreSQL an enrollment that locked the token first deadlocked with a revocation
/// of the same identity, which locks the identity and then deletes the tokens).
extension SQLBackedStore {
    public func createIdentity(_ identity: IdentityRecord, token: TokenRecord, actor: String) async throws(ILSError) {
        var token = token
        token.consumedAt = nil
        try await backend.run(.write) { [token] tx throws(ILSError) in
            let inserted = try await tx.execute(
                """
                INSERT INTO identities (id, name, role, attributes, state, created_at) VALUES (?, ?, ?, ?, ?, ?)
                ON CONFLICT (name) DO NOTHING
                """,
                [
                    .text(identity.id), .text(identity.name), .text(identity.role.rawValue),
                    .text(identity.attributes.joined(separator: ",")), .text(identity.state.rawValue),
                    .integer(identity.createdAt),
                ]
            )
            guard inserted == 1 else {
                throw ILSError(.conflict, "an identity named '\(identity.name)' already exists")
            }
            try await tx.insertToken(token)
            try await tx.insertAudit(
                actor: actor,
                action: "identity.create",
                target: identity.name,
                detail: "role=\(identity.role.rawValue)"
            )
            try await tx.notify(.identity(id: identity.id))
        }
    }

    public func identity(named name: String) async throws(ILSError) -> IdentityRecord? {
        try await backend.run(.read) { tx throws(ILSError) in try await tx.identity(where: "name", is: name) }
    }

    public func identity(id: String) async throws(ILSError) -> IdentityRecord? {
        try await backend.run(.read) { tx throws(ILSError) in try await tx.identity(where: "id", is: id) }
    }

    public func identities() async throws(ILSError) -> [IdentityRecord] {
        try await backend.run(.read) { tx throws(ILSError) in
            try await tx.query("SELECT \(StoreRows.identityColumns) FROM identities ORDER BY name\(tx.byteOrder)")
                .compactMap(StoreRows.identity)
        }
    }

    public func deleteIdentity(named name: String, actor: String) async throws(ILSError) -> IdentityRecord? {
        try await backend.run(.write) { tx throws(ILSError) -> IdentityRecord? in
            guard let record = try await tx.identity(where: "name", is: name, locked: true) else { return nil }
            // Its tokens go with it (ON DELETE CASCADE).
            try await tx.execute("DELETE FROM identities WHERE id = ?", [.text(record.id)])
            try await tx.insertAudit(actor: actor, action: "identity.delete", target: name, detail: "")
            try await tx.notify(.identity(id: record.id))
            return record
        }
    }

    public func replaceToken(_ token: TokenRecord, actor: String) async throws(ILSError) {
        var token = token
        token.consumedAt = nil
        try await backend.run(.write) { [token] tx throws(ILSError) in
            guard let owner = try await tx.identity(where: "id", is: token.identityID, locked: true) else {
                throw ILSError(.notFound, "no identity with id '\(token.identityID)'")
            }
            // Checked again here, under the row lock: a revocation that landed after the caller looked wins.
            guard owner.state != .revoked else {
                throw ILSError(.conflict, "identity '\(owner.name)' is revoked; create a new identity instead")
            }
            try await tx.execute(
                "DELETE FROM enrollment_tokens WHERE identity_id = ? AND consumed_at IS NULL",
                [.text(token.identityID)]
            )
            try await tx.insertToken(token)
            try await tx.insertAudit(actor: actor, action: "identity.reissue", target: owner.name, detail: "")
        }
    }

    public func consumeToken(jti: String, identityID: String, now: Int64, certificate: EnrolledCertificate)
        async throws(ILSError) -> IdentityRecord
    {
        try await backend.run(.write) { tx throws(ILSError) -> IdentityRecord in
            // The identity's row first (see the lock order above); whether it may enroll is decided below, after
            // the token's refusals, which come first.
            _ = try await tx.query("SELECT id FROM identities WHERE id = ?\(tx.lockClause)", [.text(identityID)])
            // Racing consumers, on any controller, take turns on the token's row: the second reads the first's
            // `consumed_at` once the first commits.
            guard
                let token = try await tx.query(
                    "SELECT identity_id, expires_at, consumed_at FROM enrollment_tokens WHERE jti = ?\(tx.lockClause)",
                    [.text(jti)]
                ).first, token[0].text == identityID
            else { throw EnrollmentRefusal.unknown.error }
            guard token[2] == .null else { throw EnrollmentRefusal.used.error }
            guard let expiresAt = token[1].integer, now < expiresAt else { throw EnrollmentRefusal.expired.error }
            let consumed = try await tx.execute(
                "UPDATE enrollment_tokens SET consumed_at = ? WHERE jti = ? AND consumed_at IS NULL",
                [.integer(now), .text(jti)]
            )
            guard consumed == 1 else { throw EnrollmentRefusal.used.error }
            let updated = try await tx.execute(
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
            guard updated == 1, let record = try await tx.identity(where: "id", is: identityID) else {
                throw EnrollmentRefusal.unknown.error
            }
            try await tx.insertAudit(
                actor: record.name,
                action: "identity.enroll",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            try await tx.notify(.identity(id: identityID))
            return record
        }
    }

    public func changeState(named name: String, to target: IdentityState, actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await backend.run(.write) { tx throws(ILSError) -> IdentityRecord in
            guard let current = try await tx.identity(where: "name", is: name, locked: true) else {
                throw ILSError(.notFound, "no identity named '\(name)'")
            }
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
            try await tx.execute(
                "UPDATE identities SET state = ? WHERE id = ?",
                [.text(target.rawValue), .text(current.id)]
            )
            if target == .revoked {
                // A revoked identity can never enroll again: its outstanding tokens go too.
                try await tx.execute("DELETE FROM enrollment_tokens WHERE identity_id = ?", [.text(current.id)])
            }
            let action =
                target == .revoked ? "identity.revoke" : target == .disabled ? "identity.disable" : "identity.enable"
            try await tx.insertAudit(actor: actor, action: action, target: name, detail: "")
            try await tx.notify(.identity(id: current.id))
            var updated = current
            updated.state = target
            return updated
        }
    }

    public func renewCertificate(id: String, previousFingerprint: String, certificate: EnrolledCertificate, now: Int64)
        async throws(ILSError) -> IdentityRecord
    {
        try await backend.run(.write) { tx throws(ILSError) -> IdentityRecord in
            // Of two renewals racing, the second's UPDATE finds the fingerprint changed (on PostgreSQL it waits for
            // the first's row lock, then reads the committed row) and changes nothing.
            let updated = try await tx.execute(
                """
                UPDATE identities SET cert_fingerprint = ?, cert_not_after = ?, public_key = ?, last_seen_at = ?
                WHERE id = ? AND cert_fingerprint = ? AND state = 'active'
                """,
                [
                    .text(certificate.fingerprint), .integer(certificate.notAfter), .text(certificate.publicKey),
                    .integer(now), .text(id), .text(previousFingerprint),
                ]
            )
            guard updated == 1, let record = try await tx.identity(where: "id", is: id) else {
                throw ILSError(.conflict, "the certificate was already renewed or replaced")
            }
            try await tx.insertAudit(
                actor: record.name,
                action: "identity.renew",
                target: record.name,
                detail: "certificate=\(certificate.fingerprint.prefix(16))"
            )
            try await tx.notify(.identity(id: id))
            return record
        }
    }

    public func recordLastSeen(_ times: [String: Int64]) async throws(ILSError) {
        guard !times.isEmpty else { return }
        // In id order, so two controllers' batches lock rows in one order.
        let sorted = times.sorted { $0.key < $1.key }
        try await backend.run(.write) { tx throws(ILSError) in
            for (id, time) in sorted {
                try await tx.execute(
                    """
                    UPDATE identities SET last_seen_at = ?
                    WHERE id = ? AND (last_seen_at IS NULL OR last_seen_at < ?)
                    """,
                    [.integer(time), .text(id), .integer(time)]
                )
            }
        }
    }

    public func updateAttributes(named name: String, attributes: [String], actor: String) async throws(ILSError)
        -> IdentityRecord
    {
        try await backend.run(.write) { tx throws(ILSError) -> IdentityRecord in
            guard var record = try await tx.identity(where: "name", is: name, locked: true) else {
                throw ILSError(.notFound, "no identity named '\(name)'")
            }
            let before = record.attributes
            record.attributes = attributes
            try await tx.execute(
                "UPDATE identities SET attributes = ? WHERE id = ?",
                [.text(attributes.joined(separator: ",")), .text(record.id)]
            )
            try await tx.insertAudit(
                actor: actor,
                action: "identity.attributes",
                target: name,
                detail: ServiceAudit.attributes(from: before, to: attributes)
            )
            try await tx.notify(.identity(id: record.id))
            return record
        }
    }
}
