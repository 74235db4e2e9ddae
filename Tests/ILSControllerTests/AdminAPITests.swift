import Foundation
import ILSClient
import ILSController
import ILSCore
import ILSCrypto
import ILSStore
import ILSTesting
import Testing

@Suite("Admin API and controller state")
struct AdminAPITests {
    @Test("init writes private keys 0600 and refuses a directory that is not empty")
    func initState() async throws {
        try await ControllerFixture.with { fixture in
            let state = "\(fixture.directory)/state"
            for name in ["ca.key", "server.key", "token.key", "store.sqlite"] {
                #expect(fileMode("\(state)/\(name)") == 0o600, "\(name)")
            }
            #expect(fileMode(fixture.adminPath) == 0o600)
            let before = try FileManager.default.contentsOfDirectory(atPath: state).sorted()
            let caBefore = try String(contentsOfFile: "\(state)/ca.pem", encoding: .utf8)
            await #expect(throws: ILSError.self) {
                _ = try await ControllerState.initialize(
                    directory: state,
                    address: try ControllerAddress(parsing: "https://127.0.0.1:1"),
                    adminOut: "\(fixture.directory)/other-admin.json"
                )
            }
            #expect(try FileManager.default.contentsOfDirectory(atPath: state).sorted() == before)
            #expect(try String(contentsOfFile: "\(state)/ca.pem", encoding: .utf8) == caBefore)
            #expect(!FileManager.default.fileExists(atPath: "\(fixture.directory)/other-admin.json"))
        }
    }

    @Test("init over a shared store that already has identities is refused, and writes neither state nor admin")
    func initRefusesAStoreInUse() async throws {
        try await ControllerFixture.with { fixture in
            // The fixture's store, as a second `controller init --store URL` would find a cluster's.
            let store = try SQLiteControllerStore(path: "\(fixture.directory)/state/store.sqlite")
            let before = try await store.exportRecords()
            let other = "\(fixture.directory)/second"
            let refused = await #expect(throws: ILSError.self) {
                _ = try await ControllerState.initialize(
                    directory: other,
                    address: try ControllerAddress(parsing: "https://127.0.0.1:1"),
                    adminOut: "\(other)-admin.json",
                    store: store
                )
            }
            #expect(refused?.code == .conflict)
            #expect(refused?.reason.contains("controller join") == true)
            #expect(!FileManager.default.fileExists(atPath: other))
            #expect(!FileManager.default.fileExists(atPath: "\(other)-admin.json"))
            #expect(try await store.exportRecords() == before)
            await store.close()
        }
    }

    @Test("a restarted controller on the same state directory keeps every identity")
    func restartKeepsIdentities() async throws {
        try await ControllerFixture.with { fixture in
            _ = try await fixture.token(for: "ipad")
            _ = try await fixture.token(for: "laptop")
            let before: [IdentityRecord] = try await fixture.admin.call(.GET, "/v1/admin/identities")
            await fixture.server.shutdown()
            let reloaded = try await ControllerState.load(directory: "\(fixture.directory)/state")
            let port = try ControllerAddress(parsing: reloaded.address.description).port
            let again = try await ControllerFixture.start(directory: fixture.directory, state: reloaded, port: port)
            let after: [IdentityRecord] = try await again.admin.call(.GET, "/v1/admin/identities")
            // Everything but "last seen", which the admin's own calls move forward.
            func stable(_ records: [IdentityRecord]) -> [IdentityRecord] {
                records.map { record in
                    var copy = record
                    copy.lastSeenAt = nil
                    return copy
                }
            }
            #expect(stable(after) == stable(before))
            #expect(Set(after.map(\.name)) == ["admin", "ipad", "laptop"])
            await again.server.shutdown()
        }
    }

    @Test("a device identity cannot use the admin API")
    func deviceIsNotAdmin() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let result = try await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("ipad.json"),
                force: false,
                answerTimeout: ControllerClient.patientTimeout
            )
            let device = try ControllerClient(identityFile: result.file).patient
            await #expect(throws: ILSError.self) {
                let _: [IdentityRecord] = try await device.call(.GET, "/v1/admin/identities")
            }
            do {
                let _: [IdentityRecord] = try await device.call(.GET, "/v1/admin/identities")
            } catch {
                #expect((error as? ILSError)?.code == .permissionDenied)
            }
        }
    }

    @Test("after reissue and re-enrollment, the previous certificate is no longer accepted")
    func reissueReplacesCertificate() async throws {
        try await ControllerFixture.with { fixture in
            let oldAdmin = try fixture.admin
            let reissued: ControllerAPI.TokenResponse = try await oldAdmin.call(
                .POST,
                "/v1/admin/identities/admin/reissue",
                body: ControllerAPI.ReissueRequest(tokenLifetimeSeconds: 600)
            )
            // Until the new token is used, the old certificate still works.
            let _: [IdentityRecord] = try await oldAdmin.call(.GET, "/v1/admin/identities")
            let result = try await Enrollment.enroll(
                token: reissued.token,
                outputPath: fixture.path("admin2.json"),
                force: false
            )
            let newAdmin = try ControllerClient(identityFile: result.file).patient
            let _: [IdentityRecord] = try await newAdmin.call(.GET, "/v1/admin/identities")
            do {
                let _: [IdentityRecord] = try await oldAdmin.call(.GET, "/v1/admin/identities")
                Issue.record("the replaced certificate was accepted")
            } catch {
                #expect((error as? ILSError)?.code == .permissionDenied)
            }
        }
    }

    @Test(
        "names that could escape a directory or inject a header are refused, and nothing is created",
        arguments: ["../evil", "a/b", ".hidden", "-flag", "x y", "", String(repeating: "a", count: 65), "é"]
    )
    func badNames(name: String) async throws {
        try await ControllerFixture.with { fixture in
            do {
                _ = try await fixture.token(for: name)
                Issue.record("'\(name)' was accepted")
            } catch let error as ILSError {
                #expect(error.code == .invalidArgument)
            }
            #expect(try await fixture.state.store.identities().map(\.name) == ["admin"])
        }
    }

    @Test("deleting an identity makes its outstanding token unknown")
    func deleteThenEnroll() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let _: [String: String] = try await fixture.admin.call(.DELETE, "/v1/admin/identities/ipad")
            await #expect(throws: EnrollmentRefusal.unknown.error) {
                _ = try await Enrollment.enroll(
                    token: token,
                    outputPath: fixture.path("ipad.json"),
                    force: false,
                    answerTimeout: ControllerClient.patientTimeout
                )
            }
            #expect(!FileManager.default.fileExists(atPath: fixture.path("ipad.json")))
        }
    }

    @Test("the audit log records creations, enrollments and refusals with their actor")
    func auditLog() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            _ = try await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("a.json"),
                force: false,
                answerTimeout: ControllerClient.patientTimeout
            )
            _ = try? await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("b.json"),
                force: false,
                answerTimeout: ControllerClient.patientTimeout
            )
            // A refusal's row is queued as its answer goes out (AuditQueue): written once the queue is flushed.
            await fixture.controller.flushRefusals()
            let entries = try await fixture.state.store.auditEntries(since: 0)
            #expect(entries.contains { $0.action == "identity.create" && $0.target == "ipad" && $0.actor == "admin" })
            #expect(entries.contains { $0.action == "identity.enroll" && $0.target == "ipad" })
            #expect(entries.contains { $0.action == "enroll.refused" && $0.detail == "token_used" })
            #expect(!entries.contains { $0.detail.contains(token) })
        }
    }

    @Test("whoami accepts an active identity and refuses it once disabled; an expired certificate is refused locally")
    func whoamiAndExpiry() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let file = try await Enrollment.enroll(
                token: token,
                outputPath: fixture.path("ipad.json"),
                force: false,
                answerTimeout: ControllerClient.patientTimeout
            )
            .file
            let device = try ControllerClient(identityFile: file).patient
            let me: IdentityRecord = try await device.call(.GET, "/v1/whoami")
            #expect(me.name == "ipad")
            #expect(me.lastSeenAt != nil)
            let _: IdentityRecord = try await fixture.admin.call(.POST, "/v1/admin/identities/ipad/disable")
            do {
                let _: IdentityRecord = try await device.call(.GET, "/v1/whoami")
                Issue.record("a disabled identity was accepted")
            } catch {
                #expect((error as? ILSError)?.code == .permissionDenied)
            }
            let later = Date().addingTimeInterval(CertificateAuthority.identityCertificateLifetime + 86400)
            #expect(throws: ILSError.self) { try IdentityValidity.check(file, now: later) }
            do {
                try IdentityValidity.check(file, now: later)
            } catch {
                #expect((error as? ILSError)?.reason.contains("reissue") == true)
            }
        }
    }

    @Test("renewal gives a new key and certificate without a token; the old certificate stops being accepted")
    func renewal() async throws {
        try await ControllerFixture.with { fixture in
            let token = try await fixture.token(for: "ipad")
            let path = fixture.path("ipad.json")
            let old = try await Enrollment.enroll(token: token, outputPath: path, force: false).file
            #expect(!Renewal.isDue(old))
            #expect(Renewal.isDue(old, now: Date().addingTimeInterval(70 * 86400)))
            let renewed = try await Renewal.renew(path: path)
            #expect(renewed.privateKey != old.privateKey)
            #expect(fileMode(path) == 0o600)
            #expect(try IdentityFileIO.read(path).certificate == renewed.certificate)
            let me: IdentityRecord = try await ControllerClient(identityFile: renewed).patient.call(.GET, "/v1/whoami")
            #expect(me.certificateFingerprint == (try IdentityCertificate(pem: renewed.certificate)).fingerprint)
            do {
                let _: IdentityRecord = try await ControllerClient(identityFile: old).patient.call(.GET, "/v1/whoami")
                Issue.record("the replaced certificate was accepted")
            } catch {
                #expect((error as? ILSError)?.code == .permissionDenied)
            }
            #expect(try await fixture.state.store.auditEntries(since: 0).contains { $0.action == "identity.renew" })
        }
    }
}

@Suite("Joining a controller replica")
struct ControllerJoinTests {
    @Test("a controller on SQLite refuses to hand out its secrets, and writes no audit row")
    func sqliteRefusesJoin() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let before = try await state.store.auditEntries(since: 0).count
        let opener = ControllerSecrets.Opener()
        await #expect(throws: ILSError.self) {
            _ = try await Controller(state: state).join(
                ControllerAPI.JoinRequest(address: "https://ctl-b:7443", publicKey: Base64URL.encode(opener.publicKey)),
                actor: "admin"
            )
        }
        #expect(try await state.store.auditEntries(since: 0).count == before)
    }

    @Test("a replica's state has the cluster's CA and token key and its own TLS certificate, keys 0600")
    func replicaState() async throws {
        let (state, directory) = try await temporaryControllerState()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let secrets = ControllerSecrets(
            caKey: state.authority.privateKeyPEM,
            tokenKey: try String(contentsOfFile: "\(state.directory)/token.key", encoding: .utf8)
        )
        let replica = "\(directory)/replica"
        let files = try ControllerState.initializeReplica(
            directory: replica,
            address: try ControllerAddress(parsing: "https://127.0.0.2:7444"),
            caCertificatePEM: state.authority.certificatePEM,
            secrets: secrets
        )
        #expect(files.authority.fingerprint == state.authority.fingerprint)
        #expect(files.serverCertificatePEM != state.serverCertificatePEM)
        #expect(!FileManager.default.fileExists(atPath: "\(replica)/store.sqlite"))
        for name in ["ca.key", "token.key", "server.key"] {
            let mode = try FileManager.default.attributesOfItem(atPath: "\(replica)/\(name)")[.posixPermissions]
            #expect(mode as? Int == 0o600, "\(name)")
        }
        // Not twice into the same directory, and nothing is changed by the refusal.
        let listing = try FileManager.default.contentsOfDirectory(atPath: replica).sorted()
        #expect(throws: ILSError.self) {
            _ = try ControllerState.initializeReplica(
                directory: replica,
                address: try ControllerAddress(parsing: "https://127.0.0.2:7444"),
                caCertificatePEM: state.authority.certificatePEM,
                secrets: secrets
            )
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: replica).sorted() == listing)
    }
}
