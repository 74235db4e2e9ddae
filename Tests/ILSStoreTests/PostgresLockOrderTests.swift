import Foundation
import ILSCore
import ILSStore
import ILSStorePostgres
import ILSTesting
import Logging
import PostgresNIO
import Testing

/// Two controllers writing the same identity at once on one PostgreSQL: every write locks the identity's row before
/// its tokens', so two of them queue instead of deadlocking (PostgreSQL would abort one with 40P01, which reached the
/// admin or the device as an internal error).
@Suite("PostgreSQL store: lock order", .serialized, .timeLimit(.minutes(3)))
struct PostgresLockOrderTests {
    /// A connection of the test's own that holds row locks in an open transaction, as a slow third writer would.
    private struct LockHolder {
        let connection: PostgresConnection
        static let logger = Logger(label: "ils.test.lock-holder", factory: { _ in SwiftLogNoOpLogHandler() })

        static func connect(_ server: TestPostgres, database: String) async throws -> LockHolder {
            let configuration = PostgresConnection.Configuration(
                host: "127.0.0.1",
                port: server.port,
                username: TestPostgres.user,
                password: TestPostgres.password,
                database: database,
                tls: .disable
            )
            return LockHolder(
                connection: try await PostgresConnection.connect(configuration: configuration, id: 1, logger: logger)
            )
        }

        func lockToken(_ jti: String) async throws {
            try await connection.query("BEGIN", logger: Self.logger)
            try await connection.query(
                "SELECT jti FROM enrollment_tokens WHERE jti = \(jti) FOR UPDATE",
                logger: Self.logger
            )
        }

        func release() async throws {
            try await connection.query("COMMIT", logger: Self.logger)
            try await connection.close()
        }
    }

    /// Until `count` of the database's sessions wait for a lock (the event each step of the test waits for).
    private static func waiters(_ count: Int, in database: String, server: TestPostgres) async -> Bool {
        await TestCluster.eventually {
            let waiting = try? server.psql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'",
                database: database
            )
            return waiting?.trimmingCharacters(in: .whitespacesAndNewlines) == "\(count)"
        }
    }

    @Test(
        "an enrollment and a revocation of the same identity at once: both finish, neither as an internal error",
        .enabled(if: TestPostgres.skipReason == nil)
    )
    func enrollmentRacingRevocation() async throws {
        let server = try TestPostgres.shared()
        let url = try server.createDatabase()
        let database = TestPostgres.databaseName(url)
        let enrolling = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        let revoking = try await PostgresControllerStore(url: url, logger: StoreKind.logger)
        let identity = pendingIdentity("tablet")
        try await enrolling.createIdentity(identity, token: token(for: identity), actor: "admin")

        // A third session holds the token's row, so the enrollment waits at its first lock on the token (before the
        // fix it had none on the identity yet) and the revocation then reaches the token's row too.
        let holder = try await LockHolder.connect(server, database: database)
        try await holder.lockToken("jti-tablet")
        let enrollment = Task {
            await refusal {
                _ = try await enrolling.consumeToken(
                    jti: "jti-tablet",
                    identityID: identity.id,
                    now: 1_700_000_100,
                    certificate: certificate("fp-tablet")
                )
            }
        }
        #expect(await Self.waiters(1, in: database, server: server), "the enrollment never waited for a lock")
        let revocation = Task {
            await refusal { _ = try await revoking.changeState(named: "tablet", to: .revoked, actor: "admin") }
        }
        #expect(await Self.waiters(2, in: database, server: server), "the revocation never waited for a lock")
        try await holder.release()

        let enrolled = await enrollment.value
        let revoked = await revocation.value
        #expect(enrolled?.code != .internalError, "the enrollment failed: \(String(describing: enrolled))")
        #expect(revoked == nil, "the revocation failed: \(String(describing: revoked))")
        // Whichever went first, the identity ends revoked with no token left to enroll with.
        #expect(try await enrolling.identity(named: "tablet")?.state == .revoked)
        let tokens = try server.psql("SELECT count(*) FROM enrollment_tokens", database: database)
        #expect(tokens.trimmingCharacters(in: .whitespacesAndNewlines) == "0")
        await enrolling.close()
        await revoking.close()
    }
}
