import Foundation
import ILSCore
import ILSStore
import ILSStorePostgres
import ILSTesting
import Testing

/// Where the two stores used to answer differently, before their rules were written once (docs/design/store.md,
/// "Behaviours settled"): each is now the same on both, and each test would catch one backend drifting again.
@Suite("Store rules: one answer on every backend", .serialized, .timeLimit(.minutes(3)))
struct StoreRulesTests {
    @Test("a duplicate key is a conflict, and the refused write leaves nothing", arguments: StoreKind.allCases)
    func duplicateKey(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        try await store.audit(actor: "admin", action: "test.first", target: "-", detail: "")
        let entries = try await store.auditEntries(since: 0)
        let copy = AuditEntry(seq: entries[0].seq, at: 1, actor: "x", action: "test.copy", target: "-", detail: "")
        let error = await refusal { try await store.importAudit([copy]) }
        #expect(error?.code == .conflict, "\(String(describing: error))")
        #expect(try await store.auditEntries(since: 0) == entries)
        await cleanup()
    }

    @Test(
        "a reissue for an identity revoked meanwhile is refused under its row lock and leaves no token",
        arguments: StoreKind.allCases
    )
    func reissueAfterRevocation(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        let ipad = try await enrolled("ipad", in: store)
        _ = try await other.changeState(named: "ipad", to: .revoked, actor: "admin")
        let rows = try await store.auditEntries(since: 0).count
        let error = await refusal { try await store.replaceToken(token(for: ipad, jti: "late"), actor: "admin") }
        #expect(error?.code == .conflict && error?.reason.contains("revoked") == true, "\(String(describing: error))")
        #expect(try await store.exportRecords().tokens.isEmpty)
        #expect(try await store.auditEntries(since: 0).count == rows)
        let gone = TokenRecord(jti: "orphan", identityID: "no-such-id", createdAt: 1, expiresAt: 2)
        #expect(await refusal { try await store.replaceToken(gone, actor: "admin") }?.code == .notFound)
        await cleanup()
    }

    @Test("after close every call fails as unavailable, naming the store", arguments: StoreKind.allCases)
    func closed(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        await store.close()
        let error = await refusal { _ = try await store.identities() }
        #expect(error?.code == .unavailable && error?.reason.contains("is closed") == true)
        #expect(error?.reason.contains(TestPostgres.password) == false)
        await cleanup()
    }

    /// Names sort by their bytes on both, whatever the database's collation: PostgreSQL's default on Debian is a
    /// language's (en_US), which put "alpha" before "Beta" and made `controller migrate`'s check of SQLite's export
    /// against PostgreSQL's fail after copying everything.
    @Test("lists sort names byte by byte, also in a PostgreSQL database whose collation is a language's")
    func byteOrder() async throws {
        let names = ["alpha", "Beta", "a_b", "a-b"]
        let expected = names.sorted { Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8)) }
        #expect(expected == ["Beta", "a-b", "a_b", "alpha"])
        var stores: [(any ControllerStore, @Sendable () async -> Void)] = []
        let (sqlite, _, cleanupSQLite) = try await StoreKind.sqlite.make()
        stores.append((sqlite, cleanupSQLite))
        if TestPostgres.skipReason == nil {
            let server = try TestPostgres.shared()
            let base = TestPostgres.databaseName(try server.createDatabase())
            let database = base + "_icu"
            _ = try server.psql(
                "CREATE DATABASE \(database) TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'",
                database: base
            )
            let collation = try server.psql(
                "SELECT datlocprovider FROM pg_database WHERE datname = '\(database)'",
                database: base
            )
            try #require(collation.hasPrefix("i"), "the database does not collate with ICU: \(collation)")
            let store = try await PostgresControllerStore(url: server.url(database: database), logger: StoreKind.logger)
            stores.append((store, { await store.close() }))
        }
        for (store, cleanup) in stores {
            for name in names {
                let identity = pendingIdentity(name)
                try await store.createIdentity(identity, token: token(for: identity, jti: "jti-\(name)"), actor: "a")
                try await store.createService(ServiceRecord(name: name, dialRoles: [.device], bindRoles: [.gateway]))
                try await store.heartbeat(ControllerMember(address: name, startedAt: 1, lastSeenAt: 1))
            }
            #expect(try await store.identities().map(\.name) == expected)
            #expect(try await store.services().map(\.name).filter(names.contains) == expected)
            #expect(try await store.controllers(seenSince: 0).map(\.address) == expected)
            let records = try await store.exportRecords()
            #expect(records.identities.map(\.record.name) == expected)
            #expect(records.tokens.map(\.jti) == expected.map { "jti-\($0)" })
            await cleanup()
        }
    }
}
