import Foundation
import ILSCore
import ILSStorePostgres
import ILSTesting
import Testing

@testable import ILSStore

/// Services with policies and revisions, attribute changes, and rows an earlier release wrote, on both stores.
@Suite("Services and policies in the store", .serialized, .timeLimit(.minutes(3)))
struct ServiceStoreTests {
    private func policy(_ semantic: ServicePolicy.Semantic, _ texts: [String]) throws -> ServicePolicy {
        var tokens: [ServicePolicy.Token] = []
        for text in texts { tokens.append(try ServicePolicy.Token(parsing: text, resolve: { _ in nil })) }
        return try ServicePolicy(semantic, tokens)
    }

    @Test(
        "create, update at the revision read, delete, each audited; a stale revision is refused and writes nothing",
        arguments: StoreKind.allCases
    )
    func lifecycle(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        let service = ServiceRecord(
            name: "second-api",
            dial: try policy(.allOf, ["role:device", "#ipad"]),
            bind: try policy(.anyOf, ["@id:gw-7f3c"])
        )
        try await store.createService(service, actor: "admin")
        #expect(try await other.service(named: "second-api") == service)
        #expect(try await store.service(named: "second-api")?.revision == 1)

        var narrowed = service
        narrowed.dial = try policy(.anyOf, ["#ipad"])
        let updated = try await store.updateService(narrowed, expectedRevision: 1, actor: "admin")
        #expect(updated.revision == 2)
        #expect(try await other.service(named: "second-api") == updated)

        // A second admin who read revision 1 loses: nothing written, no audit row.
        let rows = try await store.auditEntries(since: 0).count
        var stale = service
        stale.dial = try policy(.anyOf, ["#all"])
        let conflict = await refusal { _ = try await other.updateService(stale, expectedRevision: 1, actor: "bob") }
        #expect(conflict?.code == .conflict)
        #expect(try await store.service(named: "second-api") == updated)
        #expect(try await store.auditEntries(since: 0).count == rows)
        let missing = await refusal {
            _ = try await store.updateService(
                ServiceRecord(name: "ghost", dialRoles: [], bindRoles: []),
                expectedRevision: 1,
                actor: "admin"
            )
        }
        #expect(missing?.code == .notFound)

        #expect(try await store.deleteService(named: "second-api", actor: "admin") == updated)
        #expect(try await store.deleteService(named: "second-api", actor: "admin") == nil)
        #expect(try await other.service(named: "second-api") == nil)

        let audit = try await store.auditEntries(since: 0).filter { $0.action.hasPrefix("service.") }
        #expect(audit.map(\.action) == ["service.create", "service.update", "service.delete"])
        #expect(audit[0].detail == "dial=allOf(role:device, #ipad) bind=anyOf(@id:gw-7f3c)")
        #expect(audit[1].detail == "dial=anyOf(#ipad) (was allOf(role:device, #ipad))")
        await cleanup()
    }

    @Test("attributes are replaced whole and audited; an unknown identity is refused", arguments: StoreKind.allCases)
    func attributes(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        var ipad = pendingIdentity("ipad")
        ipad.attributes = []
        try await store.createIdentity(ipad, token: token(for: ipad), actor: "admin")
        let record = try await store.updateAttributes(named: "ipad", attributes: ["ipad", "home"], actor: "admin")
        #expect(record.attributes == ["ipad", "home"])
        #expect(try await other.identity(named: "ipad")?.attributes == ["ipad", "home"])
        _ = try await store.updateAttributes(named: "ipad", attributes: [], actor: "admin")
        #expect(try await other.identity(named: "ipad")?.attributes == [])
        let missing = await refusal {
            _ = try await store.updateAttributes(named: "nobody", attributes: [], actor: "a")
        }
        #expect(missing?.code == .notFound)
        let audit = try await store.auditEntries(since: 0).filter { $0.action == "identity.attributes" }
        #expect(audit.map(\.detail) == ["[ipad,home] (was [])", "[] (was [ipad,home])"])
        await cleanup()
    }

    @Test("export and import carry policies and revisions", arguments: StoreKind.allCases)
    func migrateCarriesPolicies(kind: StoreKind) async throws {
        let (source, _, cleanSource) = try await kind.make()
        let (target, _, cleanTarget) = try await kind.make()
        let service = ServiceRecord(name: "second-api", dial: try policy(.anyOf, ["#ipad"]), bind: .roles([.gateway]))
        try await source.createService(service, actor: "admin")
        var updated = service
        updated.bind = try policy(.anyOf, ["#edge"])
        _ = try await source.updateService(updated, expectedRevision: 1, actor: "admin")
        try await target.importRecords(try await source.exportRecords())
        let copied = try await target.service(named: "second-api")
        #expect(copied?.dial == updated.dial)
        #expect(copied?.bind == updated.bind)
        #expect(copied?.revision == 2)
        await cleanSource()
        await cleanTarget()
    }

    @Test("a row an earlier release wrote reads as its roles; a write keeps the roles column for that release")
    func legacySQLiteRow() async throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("ils-legacy-\(UUID())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let path = directory.appendingPathComponent("store.sqlite").path
        // A store of schema 3, as the release before policies left it: the columns of migration 4 do not exist.
        do {
            let store = try SQLiteControllerStore(path: path)
            await store.close()
            let database = try SQLiteDatabase(path: path)
            for statement in [
                "ALTER TABLE services DROP COLUMN dial_policy", "ALTER TABLE services DROP COLUMN bind_policy",
                "ALTER TABLE services DROP COLUMN revision",
                "INSERT INTO services (name, dial_roles, bind_roles, created_at) VALUES ('console', 'device,admin', 'gateway', 1)",
                "PRAGMA user_version = 3",
            ] {
                _ = try database.execute(statement)
            }
        }
        let store = try SQLiteControllerStore(path: path)
        let console = try #require(try await store.service(named: "console"))
        #expect(console.dial == .roles([.device, .admin]))
        #expect(console.bind == .roles([.gateway]))
        #expect(console.revision == 1)
        var narrowed = console
        narrowed.dial = try policy(.allOf, ["role:device", "#ipad"])
        _ = try await store.updateService(narrowed, expectedRevision: 1, actor: "admin")
        await store.close()
        let database = try SQLiteDatabase(path: path)
        let row = try database.query("SELECT dial_roles, dial_policy FROM services WHERE name = 'console'").first
        // allOf(role, attribute) told to a release that knows roles only would allow more: it is told nobody.
        #expect(row?[0].text == "")
        #expect(row?[1].text == ##"{"semantic":"allOf","tokens":["role:device","#ipad"]}"##)
    }

    @Test("PostgreSQL: a row an earlier release wrote reads as its roles after migration 2")
    func legacyPostgresRow() async throws {
        let url = try TestPostgres.shared().createDatabase()
        let name = String(url.split(separator: "/").last!.split(separator: "?").first!)
        do {
            let store = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
            await store.close()
        }
        _ = try TestPostgres.shared().psql(
            """
            ALTER TABLE services DROP COLUMN dial_policy, DROP COLUMN bind_policy, DROP COLUMN revision;
            INSERT INTO services (name, dial_roles, bind_roles, created_at) VALUES ('console', 'admin', 'gateway', 1);
            UPDATE ils_schema SET version = 1;
            """,
            database: name
        )
        let store = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        let console = try #require(try await store.service(named: "console"))
        #expect(console.dial == .roles([.admin]))
        #expect(console.revision == 1)
        var widened = console
        widened.dial = try policy(.anyOf, ["role:admin", "#ops"])
        _ = try await store.updateService(widened, expectedRevision: 1, actor: "admin")
        await store.close()
        let roles = try TestPostgres.shared().psql(
            "SELECT dial_roles FROM services WHERE name = 'console'",
            database: name
        )
        #expect(roles.trimmingCharacters(in: .whitespacesAndNewlines) == "admin")
    }

    @Test(
        "the audit log filters by actor, exact action, action family and target, with paging",
        arguments: StoreKind.allCases
    )
    func auditFilters(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let rows: [(String, String, String)] = [
            ("admin", "identity.create", "ipad"), ("admin", "identity.revoke", "ipad"),
            ("ops", "identity.revoke", "mac"), ("ops", "service.update", "claude-api"),
            // '_' and '%' are themselves: a LIKE would match these for "identity_" or "%".
            ("ops", "identityXrevoke", "ipad"), ("admin", "identity.disable", "ipad_2"),
        ]
        for (actor, action, target) in rows {
            try await store.audit(actor: actor, action: action, target: target, detail: "")
        }
        func page(_ filter: AuditFilter, before: Int64? = nil, limit: Int = 100) async throws -> [String] {
            try await store.auditEntries(since: 0, before: before, limit: limit, filter: filter).map {
                "\($0.actor) \($0.action) \($0.target)"
            }
        }
        #expect(
            try await page(AuditFilter(action: "identity.revoke")) == [
                "admin identity.revoke ipad", "ops identity.revoke mac",
            ]
        )
        #expect(
            try await page(AuditFilter(action: "identity.revoke", target: "ipad")) == ["admin identity.revoke ipad"]
        )
        #expect(try await page(AuditFilter(actor: "ops", action: "identity.")) == ["ops identity.revoke mac"])
        #expect(try await page(AuditFilter(action: "identity.")).count == 4)
        #expect(try await page(AuditFilter(action: "identity_")).isEmpty)
        #expect(try await page(AuditFilter(target: "ipad_2")) == ["admin identity.disable ipad_2"])
        #expect(try await page(AuditFilter(target: "%")).isEmpty)
        #expect(try await page(AuditFilter(actor: "nobody")).isEmpty)
        // Paging keeps the filter: the newest match first, then the older one below its seq.
        let newest = try await store.auditEntries(since: 0, before: nil, limit: 1, filter: AuditFilter(actor: "ops"))
        #expect(newest.map(\.action) == ["identityXrevoke"])
        let older = try await page(AuditFilter(actor: "ops"), before: newest.first?.seq, limit: 1)
        #expect(older == ["ops service.update claude-api"])
        await cleanup()
    }
}
