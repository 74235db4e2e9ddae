import Foundation
import ILSClient
import ILSCore
import ILSCrypto
import ILSStore
import Logging
import Testing

@testable import ILSController

@Suite("Audit log: bounded refusal rows, safe text, pages, retention")
struct AuditLogTests {
    @Test("3,000 refusals from one source in a window are one row at once and one count row, not 3,000 rows")
    func floodFromOneSourceIsTwoRows() {
        var aggregator = RefusalAggregator(window: 60, maximumSources: 64)
        var rows: [RefusalAggregator.Row] = []
        for i in 0..<3000 {
            rows += aggregator.record(source: "203.0.113.9", code: "token_malformed", now: 1000 + Int64(i / 100))
        }
        #expect(rows == [.init(actor: "203.0.113.9", detail: "token_malformed")])
        #expect(aggregator.drain() == [.init(actor: "203.0.113.9", detail: "token_malformed count=2999")])
        #expect(aggregator.drain().isEmpty)
        // The next window starts with a row of its own again.
        #expect(
            aggregator.record(source: "203.0.113.9", code: "token_malformed", now: 1100)
                == [.init(actor: "203.0.113.9", detail: "token_malformed")]
        )
    }

    @Test("10,000 sources in one window get at most maximumSources + 1 keys; every refusal is counted")
    func manySourcesShareOneKey() {
        var aggregator = RefusalAggregator(window: 60, maximumSources: 64)
        var rows: [RefusalAggregator.Row] = []
        for i in 0..<10_000 {
            rows += aggregator.record(source: "2001:db8::\(i)", code: "token_malformed", now: 1000)
        }
        rows += aggregator.drain()
        #expect(rows.count <= 2 * 65)
        #expect(rows.contains { $0.actor == RefusalAggregator.otherSources })
        let counted = rows.reduce(0) { total, row in
            total + (row.detail.split(separator: "=").last.flatMap { Int($0) } ?? 1)
        }
        #expect(counted == 10_000)
    }

    @Test("garbage enrollments over TLS write a bounded number of audit rows; reading the log shows every refusal")
    func garbageEnrollmentsAreAggregated() async throws {
        try await ControllerFixture.with { fixture in
            let anonymous = ControllerClient(
                address: fixture.state.address,
                trust: .certificateAuthority(fixture.state.authority.certificatePEM)
            )
            let garbage = ControllerAPI.EnrollRequest(token: "a.b.c", publicKey: "x", proof: "y")
            // The aggregation window is 60 s from a source's first refusal. On a loaded machine under the address
            // sanitizer 50 TLS requests have taken longer than that, so the bound counts the windows they spanned:
            // each window is at most one row at once and one count row, and the rows together count every refusal.
            let clock = ContinuousClock()
            let started = clock.now
            for _ in 0..<50 {
                await #expect(throws: ILSError.self) {
                    let _: ControllerAPI.EnrollResponse = try await anonymous.call(.POST, "/v1/enroll", body: garbage)
                }
            }
            // The aggregator counts whole seconds: a second more covers a window that started late in its second.
            let windows = Int((clock.now - started + .seconds(1)).components.seconds / 60) + 1
            let before = try await fixture.state.store.auditEntries(since: 0).filter { $0.action == "enroll.refused" }
            // Before the admin's read: a row at once per window, and the count row of each window that ended.
            #expect((1...(2 * windows - 1)).contains(before.count))
            let page: ControllerAPI.AuditPage = try await fixture.admin.call(.GET, "/v1/admin/audit?limit=1000")
            let refused = page.entries.filter { $0.action == "enroll.refused" }
            #expect(refused.count <= 2 * windows)
            #expect(refused.first?.detail == "token_malformed")
            #expect(refused.allSatisfy { $0.detail.hasPrefix("token_malformed") })
            let counted = refused.reduce(0) { total, row in
                total + (row.detail.split(separator: "=").last.flatMap { Int($0) } ?? 1)
            }
            #expect(counted == 50)
            if windows == 1 { #expect(refused.map(\.detail) == ["token_malformed", "token_malformed count=49"]) }
        }
    }

    @Test("a peer's ESC, CR and BEL and a 10,000-character detail are stored escaped and bounded")
    func hostileAuditTextIsStoredSafe() async throws {
        let store = try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        let hostile = "svc\u{1b}[2K\r2026-01-01  admin  identity.enable  ipad\u{07}"
        try await store.audit(
            actor: hostile,
            action: "bind.refused",
            target: hostile,
            detail: String(repeating: "\u{1b}", count: 10_000)
        )
        let entry = try #require(try await store.auditEntries(since: 0).first)
        for field in [entry.actor, entry.target, entry.detail] {
            #expect(!ControlCharacters.appear(in: field))
        }
        #expect(entry.target == #"svc\x1b[2K\r2026-01-01  admin  identity.enable  ipad\x07"#)
        #expect(entry.detail.count == AuditLimits.detail)
    }

    @Test("the API pages the log: newest first page, --before for the next, nothing twice, limits checked")
    func pagination() async throws {
        try await ControllerFixture.with { fixture in
            for i in 0..<250 {
                try await fixture.state.store.audit(actor: "t", action: "test.row", target: "\(i)", detail: "")
            }
            let all = try await fixture.state.store.auditEntries(since: 0)
            var seen: [ControllerAPI.AuditEntry] = []
            var path = "/v1/admin/audit?limit=100"
            var pages = 0
            while true {
                let page: ControllerAPI.AuditPage = try await fixture.admin.call(.GET, path)
                pages += 1
                #expect(page.entries.count <= 100)
                #expect(page.entries.map(\.seq) == page.entries.map(\.seq).sorted())
                seen = page.entries + seen
                guard let next = page.nextBefore else { break }
                path = "/v1/admin/audit?limit=100&before=\(next)"
            }
            #expect(pages == 3)
            #expect(seen.map(\.seq) == all.map(\.seq))
            let newest: ControllerAPI.AuditPage = try await fixture.admin.call(.GET, "/v1/admin/audit?limit=1")
            #expect(newest.entries.map(\.target) == ["249"])
            let future: ControllerAPI.AuditPage = try await fixture.admin.call(
                .GET,
                "/v1/admin/audit?since=\(Int64(Date().timeIntervalSince1970) + 3600)"
            )
            #expect(future.entries.isEmpty && future.nextBefore == nil)
            for bad in ["limit=0", "limit=-1", "before=x", "since=1e9"] {
                await #expect(throws: ILSError.self) {
                    let _: ControllerAPI.AuditPage = try await fixture.admin.call(.GET, "/v1/admin/audit?\(bad)")
                }
            }
            let capped: ControllerAPI.AuditPage = try await fixture.admin.call(.GET, "/v1/admin/audit?limit=5000")
            #expect(capped.entries.count == all.count)
        }
    }

    @Test("a block the store could not save is enforced from memory, then saved by the maintenance pass")
    func unsavedBlockIsEnforcedThenSaved() async throws {
        let state = try Self.memoryState()
        let controller = Controller(state: state)
        let created = try await controller.createIdentity(
            .init(name: "ipad", role: .device, attributes: [], tokenLifetimeSeconds: 600),
            actor: "admin"
        )
        // What `changeState` keeps when the store's write fails (a full disk; shown end to end in test_faults.py).
        state.unsavedBlocks.add(id: created.identity.id, name: "ipad", state: .revoked, actor: "admin")
        #expect(controller.blockedIdentityIDs() == [created.identity.id])
        #expect(try await controller.identity(named: "ipad").state == .pending)
        let maintenance = StoreMaintenance(
            state: state,
            retention: .standard,
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        await maintenance.pass()
        #expect(try await controller.identity(named: "ipad").state == .revoked)
        #expect(state.unsavedBlocks.all.isEmpty)
        #expect(
            try await state.store.auditEntries(since: 0).contains {
                $0.action == "identity.revoke" && $0.actor == "admin"
            }
        )
    }

    private static func memoryState() throws -> ControllerState {
        try ControllerState(
            directory: "",
            address: ControllerAddress(parsing: "https://127.0.0.1:1"),
            authority: CertificateAuthority.create(name: "test CA", now: Date()),
            serverCertificatePEM: "",
            serverKeyPEM: "",
            tokenKey: IdentityKeyPair.generate(),
            store: try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        )
    }

    @Test("retention prunes entries past the age and beyond the row cap, oldest first, in batches")
    func retentionPrunes() async throws {
        let store = try SQLiteControllerStore(path: SQLiteControllerStore.inMemory)
        for i in 0..<2500 { try await store.audit(actor: "t", action: "test.row", target: "\(i)", detail: "") }
        #expect(try await store.pruneAudit(olderThan: 0, keepingAtMost: 1000, batch: 300) == 1500)
        let kept = try await store.auditEntries(since: 0)
        #expect(kept.count == 1000)
        #expect(kept.first?.target == "1500" && kept.last?.target == "2499")
        #expect(try await store.pruneAudit(olderThan: 0, keepingAtMost: 1000, batch: 300) == 0)

        let state = try ControllerState(
            directory: "",
            address: ControllerAddress(parsing: "https://127.0.0.1:1"),
            authority: CertificateAuthority.create(name: "test CA", now: Date()),
            serverCertificatePEM: "",
            serverKeyPEM: "",
            tokenKey: IdentityKeyPair.generate(),
            store: store
        )
        let maintenance = StoreMaintenance(
            state: state,
            retention: .init(maximumAge: .seconds(86_400), maximumRows: 1_000_000),
            logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        )
        #expect(await maintenance.pass(now: Int64(Date().timeIntervalSince1970)) == 0)
        #expect(await maintenance.pass(now: Int64(Date().timeIntervalSince1970) + 2 * 86_400) == 1000)
        #expect(try await store.auditEntries(since: 0).isEmpty)
    }
}
