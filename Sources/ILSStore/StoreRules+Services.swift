public import ILSCore

/// Services and their policies, for every backend.
extension SQLBackedStore {
    public func service(named name: String) async throws(ILSError) -> ServiceRecord? {
        try await backend.run(.read) { tx throws(ILSError) in try await tx.service(named: name) }
    }

    public func services() async throws(ILSError) -> [ServiceRecord] {
        try await backend.run(.read) { tx throws(ILSError) in
            try await tx.query("SELECT \(StoreRows.serviceColumns) FROM services ORDER BY name\(tx.byteOrder)")
                .compactMap(StoreRows.service)
        }
    }

    public func createService(_ service: ServiceRecord, actor: String) async throws(ILSError) {
        var created = service
        created.revision = 1
        try await backend.run(.write) { [created] tx throws(ILSError) in
            guard try await tx.insertService(created) else {
                throw ILSError(.conflict, "a service named '\(created.name)' already exists")
            }
            try await tx.insertAudit(
                actor: actor,
                action: "service.create",
                target: created.name,
                detail: ServiceAudit.created(created)
            )
            try await tx.notify(.services)
        }
    }

    public func updateService(_ service: ServiceRecord, expectedRevision: Int64, actor: String) async throws(ILSError)
        -> ServiceRecord
    {
        try await backend.run(.write) { tx throws(ILSError) -> ServiceRecord in
            guard let current = try await tx.service(named: service.name, locked: true) else {
                throw ILSError(.notFound, "no service named '\(service.name)'")
            }
            guard current.revision == expectedRevision else { throw ServiceAudit.stale(service.name) }
            var updated = service
            updated.revision = current.revision + 1
            try await tx.execute(
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
            try await tx.insertAudit(
                actor: actor,
                action: "service.update",
                target: service.name,
                detail: ServiceAudit.updated(from: current, to: updated)
            )
            try await tx.notify(.services)
            return updated
        }
    }

    public func deleteService(named name: String, actor: String) async throws(ILSError) -> ServiceRecord? {
        try await backend.run(.write) { tx throws(ILSError) -> ServiceRecord? in
            guard let current = try await tx.service(named: name, locked: true) else { return nil }
            try await tx.execute("DELETE FROM services WHERE name = ?", [.text(name)])
            try await tx.insertAudit(
                actor: actor,
                action: "service.delete",
                target: name,
                detail: ServiceAudit.created(current)
            )
            try await tx.notify(.services)
            return current
        }
    }
}
