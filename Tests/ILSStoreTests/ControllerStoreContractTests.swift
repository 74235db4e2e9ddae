import Foundation
import ILSCore
import ILSStore
import ILSTesting
import Testing

/// What every `ControllerStore` must do, run against SQLite and against a real PostgreSQL the tests start.
@Suite("ControllerStore contract", .serialized, .timeLimit(.minutes(3)))
struct ControllerStoreContractTests {
    @Test(
        "identities: create, look up, list by name; a duplicate name is refused and writes nothing",
        arguments: StoreKind.allCases
    )
    func identities(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let ipad = pendingIdentity("ipad")
        try await store.createIdentity(ipad, token: token(for: ipad), actor: "admin")
        let alpha = pendingIdentity("alpha")
        try await store.createIdentity(alpha, token: token(for: alpha), actor: "admin")
        #expect(try await store.identity(named: "ipad") == ipad)
        #expect(try await store.identity(id: ipad.id) == ipad)
        #expect(try await store.identity(named: "nobody") == nil)
        #expect(try await store.identities().map(\.name) == ["alpha", "ipad"])
        let rows = try await store.auditEntries(since: 0).count
        let duplicate = pendingIdentity("ipad")
        let error = await refusal {
            try await store.createIdentity(duplicate, token: token(for: duplicate, jti: "dup"), actor: "admin")
        }
        #expect(error?.code == .conflict)
        #expect(try await store.identities().count == 2)
        #expect(try await store.auditEntries(since: 0).count == rows)
        #expect(try await store.exportRecords().tokens.map(\.jti).contains("dup") == false)
        await cleanup()
    }

    @Test(
        "a token enrolls once: unknown, used and expired are refused, and a refusal changes nothing",
        arguments: StoreKind.allCases
    )
    func tokens(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let ipad = pendingIdentity("ipad")
        try await store.createIdentity(ipad, token: token(for: ipad, expiresAt: 1_700_000_500), actor: "admin")
        let expired = await refusal {
            _ = try await store.consumeToken(
                jti: "jti-ipad",
                identityID: ipad.id,
                now: 1_700_000_500,
                certificate: certificate("x")
            )
        }
        #expect(expired?.code.name == EnrollmentRefusal.expired.rawValue)
        let wrongOwner = await refusal {
            _ = try await store.consumeToken(
                jti: "jti-ipad",
                identityID: "other",
                now: 1_700_000_100,
                certificate: certificate("x")
            )
        }
        #expect(wrongOwner?.code.name == EnrollmentRefusal.unknown.rawValue)
        #expect(try await store.identity(id: ipad.id)?.state == .pending)
        let record = try await store.consumeToken(
            jti: "jti-ipad",
            identityID: ipad.id,
            now: 1_700_000_100,
            certificate: certificate("fp1")
        )
        #expect(record.state == .active && record.certificateFingerprint == "fp1" && record.lastSeenAt == 1_700_000_100)
        let used = await refusal {
            _ = try await store.consumeToken(
                jti: "jti-ipad",
                identityID: ipad.id,
                now: 1_700_000_101,
                certificate: certificate("fp2")
            )
        }
        #expect(used?.code.name == EnrollmentRefusal.used.rawValue)
        #expect(try await store.identity(id: ipad.id)?.certificateFingerprint == "fp1")
        let unknown = await refusal {
            _ = try await store.consumeToken(
                jti: "nope",
                identityID: ipad.id,
                now: 1_700_000_101,
                certificate: certificate("fp3")
            )
        }
        #expect(unknown?.code.name == EnrollmentRefusal.unknown.rawValue)
        let actions = try await store.auditEntries(since: 0).map(\.action)
        #expect(actions == ["identity.create", "identity.enroll"])
        await cleanup()
    }

    @Test(
        "of 20 enrollments racing on one token through two store clients, exactly one wins",
        arguments: StoreKind.allCases
    )
    func tokenRace(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        let ipad = pendingIdentity("ipad")
        try await store.createIdentity(ipad, token: token(for: ipad), actor: "admin")
        let outcomes = await withTaskGroup(of: String.self) { group in
            for racer in 0..<20 {
                let client = racer % 2 == 0 ? store : other
                group.addTask {
                    do {
                        _ = try await client.consumeToken(
                            jti: "jti-ipad",
                            identityID: ipad.id,
                            now: 1_700_000_100,
                            certificate: certificate("fp-\(racer)")
                        )
                        return "won"
                    } catch let error as ILSError {
                        return error.code.name
                    } catch {
                        return "\(error)"
                    }
                }
            }
            return await group.reduce(into: [String]()) { $0.append($1) }
        }
        #expect(outcomes.filter { $0 == "won" }.count == 1, "\(outcomes)")
        #expect(outcomes.filter { $0 == EnrollmentRefusal.used.rawValue }.count == 19, "\(outcomes)")
        #expect(try await store.auditEntries(since: 0).filter { $0.action == "identity.enroll" }.count == 1)
        await cleanup()
    }

    @Test(
        "state changes: revoked is final and takes the tokens; disable and enable; unknown names",
        arguments: StoreKind.allCases
    )
    func stateChanges(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let ipad = try await enrolled("ipad", in: store)
        #expect(try await store.changeState(named: "ipad", to: .disabled, actor: "admin").state == .disabled)
        #expect(try await store.changeState(named: "ipad", to: .active, actor: "admin").state == .active)
        let again = await refusal { _ = try await store.changeState(named: "ipad", to: .active, actor: "admin") }
        #expect(again?.code == .conflict)
        try await store.replaceToken(token(for: ipad, jti: "second"), actor: "admin")
        #expect(try await store.exportRecords().tokens.contains { $0.jti == "second" && $0.consumedAt == nil })
        #expect(try await store.changeState(named: "ipad", to: .revoked, actor: "admin").state == .revoked)
        #expect(try await store.exportRecords().tokens.filter { $0.identityID == ipad.id }.isEmpty)
        for target in [IdentityState.active, .disabled, .revoked] {
            let refused = await refusal { _ = try await store.changeState(named: "ipad", to: target, actor: "admin") }
            #expect(refused?.code == .conflict, "revoked → \(target)")
        }
        let missing = await refusal { _ = try await store.changeState(named: "ghost", to: .revoked, actor: "admin") }
        #expect(missing?.code == .notFound)
        let actions = try await store.auditEntries(since: 0).map(\.action)
        #expect(
            actions == [
                "identity.create", "identity.enroll", "identity.disable", "identity.enable", "identity.reissue",
                "identity.revoke",
            ]
        )
        await cleanup()
    }

    @Test("two renewals from the same certificate: one wins, the other is refused", arguments: StoreKind.allCases)
    func renewRace(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        let ipad = try await enrolled("ipad", in: store)
        async let first = refusal {
            _ = try await store.renewCertificate(
                id: ipad.id,
                previousFingerprint: "fp-ipad",
                certificate: certificate("a"),
                now: 2
            )
        }
        async let second = refusal {
            _ = try await other.renewCertificate(
                id: ipad.id,
                previousFingerprint: "fp-ipad",
                certificate: certificate("b"),
                now: 2
            )
        }
        let outcomes = [await first, await second]
        #expect(outcomes.filter { $0 == nil }.count == 1)
        #expect(outcomes.compactMap { $0?.code } == [.conflict])
        let current = try await store.identity(id: ipad.id)?.certificateFingerprint
        #expect(current == "a" || current == "b")
        await cleanup()
    }

    @Test("delete returns the record and takes its tokens; deleting again finds nothing", arguments: StoreKind.allCases)
    func delete(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let ipad = try await enrolled("ipad", in: store)
        try await store.replaceToken(token(for: ipad, jti: "pending-one"), actor: "admin")
        let deleted = try await store.deleteIdentity(named: "ipad", actor: "admin")
        #expect(deleted?.id == ipad.id)
        #expect(try await store.identity(id: ipad.id) == nil)
        #expect(try await store.exportRecords().tokens.isEmpty)
        #expect(try await store.deleteIdentity(named: "ipad", actor: "admin") == nil)
        await cleanup()
    }

    @Test(
        "last seen is written in batches and never moves backwards; unknown ids are ignored",
        arguments: StoreKind.allCases
    )
    func lastSeen(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let ipad = try await enrolled("ipad", in: store)
        try await store.recordLastSeen([ipad.id: 1_800_000_000, "ghost": 5])
        #expect(try await store.identity(id: ipad.id)?.lastSeenAt == 1_800_000_000)
        try await store.recordLastSeen([ipad.id: 1_750_000_000])
        #expect(try await store.identity(id: ipad.id)?.lastSeenAt == 1_800_000_000)
        try await store.recordLastSeen([:])
        await cleanup()
    }

    @Test("services: create, look up, list; a duplicate is refused", arguments: StoreKind.allCases)
    func services(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let api = ServiceRecord(name: "claude-api", dialRoles: [.device], bindRoles: [.gateway])
        let console = ServiceRecord(name: "console", dialRoles: [.admin], bindRoles: [.gateway])
        try await store.createService(console)
        try await store.createService(api)
        #expect(try await store.service(named: "claude-api") == api)
        #expect(try await store.service(named: "nothing") == nil)
        #expect(try await store.services() == [api, console])
        let duplicate = await refusal {
            try await store.createService(ServiceRecord(name: "console", dialRoles: [], bindRoles: []))
        }
        #expect(duplicate?.code == .conflict)
        #expect(try await store.service(named: "console") == console)
        await cleanup()
    }

    @Test(
        "the audit log keeps a peer's text escaped and bounded, pages newest first, and prunes oldest first",
        arguments: StoreKind.allCases
    )
    func audit(kind: StoreKind) async throws {
        let (store, _, cleanup) = try await kind.make()
        let hostile = "svc\u{1b}[2K\r2026-01-01  admin  identity.enable  ipad\u{07}"
        try await store.audit(
            actor: hostile,
            action: "bind.refused",
            target: hostile,
            detail: String(repeating: "x", count: 10_000)
        )
        let entry = try #require(try await store.auditEntries(since: 0).first)
        #expect(!ControlCharacters.appear(in: entry.actor) && !ControlCharacters.appear(in: entry.target))
        #expect(entry.actor.count <= AuditLimits.field + 3 && entry.detail.count <= AuditLimits.detail + 3)
        for index in 0..<250 { try await store.audit(actor: "t", action: "test.row", target: "\(index)", detail: "") }
        let newest = try await store.auditEntries(since: 0, before: nil, limit: 100)
        #expect(newest.count == 100 && newest.last?.target == "249" && newest.first?.target == "150")
        let older = try await store.auditEntries(since: 0, before: newest.first?.seq, limit: 100)
        #expect(older.last?.target == "149")
        #expect(try await store.pruneAudit(olderThan: 0, keepingAtMost: 100, batch: 60) == 151)
        let kept = try await store.auditEntries(since: 0)
        #expect(kept.count == 100 && kept.first?.target == "150")
        #expect(try await store.pruneAudit(olderThan: 0, keepingAtMost: 100, batch: 60) == 0)
        await cleanup()
    }

    @Test(
        "controllers: a heartbeat adds or refreshes a member; old ones fall out of the window",
        arguments: StoreKind.allCases
    )
    func controllers(kind: StoreKind) async throws {
        let (store, other, cleanup) = try await kind.make()
        try await store.heartbeat(ControllerMember(address: "https://a:7443", startedAt: 100, lastSeenAt: 100))
        try await other.heartbeat(ControllerMember(address: "https://b:7443", startedAt: 150, lastSeenAt: 200))
        try await store.heartbeat(ControllerMember(address: "https://a:7443", startedAt: 100, lastSeenAt: 210))
        #expect(try await other.controllers(seenSince: 0).map(\.address) == ["https://a:7443", "https://b:7443"])
        #expect(try await store.controllers(seenSince: 205).map(\.lastSeenAt) == [210])
        await cleanup()
    }

    @Test(
        "export and import copy every record; an import into a store with identities is refused and writes nothing",
        arguments: StoreKind.allCases
    )
    func exportImport(kind: StoreKind) async throws {
        let (source, _, cleanupSource) = try await kind.make()
        let (target, _, cleanupTarget) = try await kind.make()
        let ipad = try await enrolled("ipad", in: source)
        try await source.replaceToken(token(for: ipad, jti: "outstanding"), actor: "admin")
        try await enrolled("gw", in: source, role: .gateway)
        let lost = pendingIdentity("lost")
        try await source.createIdentity(lost, token: token(for: lost), actor: "admin")
        _ = try await source.changeState(named: "lost", to: .revoked, actor: "admin")
        try await source.createService(ServiceRecord(name: "claude-api", dialRoles: [.device], bindRoles: [.gateway]))
        let records = try await source.exportRecords()
        #expect(
            records.identities.count == 3
                && records.identities.allSatisfy { $0.record.state == .revoked || $0.publicKey != nil }
        )
        #expect(records.tokens.contains { $0.consumedAt != nil } && records.tokens.contains { $0.consumedAt == nil })
        try await target.importRecords(records)
        #expect(try await target.exportRecords() == records)
        let audit = try await source.auditEntries(since: 0)
        try await target.importAudit(audit)
        #expect(try await target.auditEntries(since: 0) == audit)
        try await target.audit(actor: "t", action: "after", target: "-", detail: "")
        #expect(try await target.auditEntries(since: 0).last?.seq ?? 0 > audit.last?.seq ?? 0)
        // Into a store that has identities: refused, and the store is unchanged.
        let before = try await target.exportRecords()
        let refused = await refusal { try await target.importRecords(records) }
        #expect(refused?.code == .conflict)
        #expect(try await target.exportRecords() == before)
        await cleanupSource()
        await cleanupTarget()
    }
}
