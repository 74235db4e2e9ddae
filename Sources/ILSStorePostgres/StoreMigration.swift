public import ILSCore
public import ILSStore

/// `controller migrate`: copies a whole store into an empty one, identities, tokens (outstanding and consumed),
/// services and every audit row with its `seq` and time, then checks that the target holds the same.
public enum StoreMigration {
    public struct Summary: Sendable, Equatable, Codable {
        public var identities: Int
        public var tokens: Int
        public var services: Int
        public var auditRows: Int
        public var newestAuditSeq: Int64
    }

    /// Audit rows per transaction: a page of the source's log.
    public static let auditPage = 1000

    /// Refuses a target that already has identities (nothing is written then). The copy is records first (one
    /// transaction), then the audit log oldest first in pages; a failure part way leaves the source untouched, and
    /// the target must be emptied (dropped and created again) before trying again.
    public static func copy(
        from source: any ControllerStore,
        to target: any ControllerStore,
        progress: @Sendable (Int) -> Void = { _ in }
    ) async throws(ILSError) -> Summary {
        let records = try await source.exportRecords()
        try await target.importRecords(records)
        // Oldest first: walk the source's pages from the newest back, then write them in order.
        var pages: [[AuditEntry]] = []
        var before: Int64? = nil
        while true {
            let page = try await source.auditEntries(since: 0, before: before, limit: auditPage)
            guard let first = page.first else { break }
            pages.append(page)
            before = first.seq
            if page.count < auditPage { break }
        }
        var copied = 0
        var newest: Int64 = 0
        for page in pages.reversed() {
            try await target.importAudit(page)
            copied += page.count
            newest = max(newest, page.last?.seq ?? 0)
            progress(copied)
        }
        let summary = Summary(
            identities: records.identities.count,
            tokens: records.tokens.count,
            services: records.services.count,
            auditRows: copied,
            newestAuditSeq: newest
        )
        try await verify(summary, records: records, target: target)
        return summary
    }

    private static func verify(_ summary: Summary, records: StoreRecords, target: any ControllerStore)
        async throws(ILSError)
    {
        let copied = try await target.exportRecords()
        guard copied == records else {
            throw ILSError(.internalError, "the target store's records differ from the source's after the copy")
        }
        var count = 0
        var newest: Int64 = 0
        var before: Int64? = nil
        while true {
            let page = try await target.auditEntries(since: 0, before: before, limit: auditPage)
            guard let first = page.first else { break }
            count += page.count
            newest = max(newest, page.last?.seq ?? 0)
            before = first.seq
            if page.count < auditPage { break }
        }
        guard count == summary.auditRows, newest == summary.newestAuditSeq else {
            throw ILSError(
                .internalError,
                "the target store has \(count) audit rows (newest \(newest)) after copying \(summary.auditRows) "
                    + "(newest \(summary.newestAuditSeq))"
            )
        }
    }
}
