import Foundation
import ILSCore
import ILSStore
import ILSStorePostgres
import ILSTesting
import Logging

/// The stores the contract suite runs against.
enum StoreKind: String, CaseIterable, Sendable, CustomStringConvertible {
    case sqlite
    case postgres

    var description: String { rawValue }

    static let logger = Logger(label: "ils.store.test", factory: { _ in SwiftLogNoOpLogHandler() })

    /// A fresh, empty store of this kind and a second handle on the same data (for PostgreSQL a second client, as a
    /// second controller has; for SQLite the same object, since one controller uses a file).
    func make() async throws -> (
        store: any ControllerStore, other: any ControllerStore, cleanup: @Sendable () async -> Void
    ) {
        switch self {
        case .sqlite:
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "ils-store-\(UUID().uuidString)"
            )
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let store = try SQLiteControllerStore(path: directory.appendingPathComponent("store.sqlite").path)
            return (
                store, store,
                {
                    await store.close()
                    try? FileManager.default.removeItem(at: directory)
                }
            )
        case .postgres:
            let url = try TestPostgres.shared().createDatabase()
            let store = try await PostgresControllerStore(url: url, logger: Self.logger)
            let other = try await PostgresControllerStore(url: url, logger: Self.logger)
            return (
                store, other,
                {
                    await store.close()
                    await other.close()
                }
            )
        }
    }
}

func pendingIdentity(_ name: String, role: IdentityRole = .device) -> IdentityRecord {
    IdentityRecord(
        id: UUID().uuidString.lowercased(),
        name: name,
        role: role,
        attributes: ["ipad", "home"],
        state: .pending,
        createdAt: 1_700_000_000
    )
}

func token(for identity: IdentityRecord, jti: String? = nil, expiresAt: Int64 = 4_000_000_000) -> TokenRecord {
    TokenRecord(
        jti: jti ?? "jti-\(identity.name)",
        identityID: identity.id,
        createdAt: 1_700_000_000,
        expiresAt: expiresAt
    )
}

func certificate(_ fingerprint: String) -> EnrolledCertificate {
    EnrolledCertificate(fingerprint: fingerprint, notAfter: 1_800_000_000, publicKey: "key-\(fingerprint)")
}

/// Creates and enrolls an identity; returns its active record.
@discardableResult
func enrolled(_ name: String, in store: any ControllerStore, role: IdentityRole = .device) async throws
    -> IdentityRecord
{
    let identity = pendingIdentity(name, role: role)
    try await store.createIdentity(identity, token: token(for: identity), actor: "admin")
    return try await store.consumeToken(
        jti: "jti-\(name)",
        identityID: identity.id,
        now: 1_700_000_100,
        certificate: certificate("fp-\(name)")
    )
}

/// The refusal `body` throws, or nil.
func refusal(_ body: () async throws -> Void) async -> ILSError? {
    do {
        try await body()
        return nil
    } catch let error as ILSError {
        return error
    } catch {
        return ILSError(.internalError, "unexpected \(error)")
    }
}
