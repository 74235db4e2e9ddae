import Foundation
import ILSCore
import ILSStore
import Logging
import PostgresNIO

/// PostgreSQL under the store's rules, through postgres-nio's `PostgresClient` (a pool of at most 8 connections).
///
/// - Writes run at READ COMMITTED; the rules lock the rows they will change (`FOR UPDATE`), so of two controllers
///   racing on a token or a state, the second reads the first's commit.
/// - `notify` is `pg_notify('ils_changes', …)` in the transaction: PostgreSQL delivers it at commit, to every
///   controller listening (`changes()`), and never for a transaction that rolled back.
/// - Bounded in time: connecting gives up after 5 s, the server cancels a statement after 5 s
///   (`statement_timeout`), and each call as a whole after 10 s, so a store that is down answers `.unavailable`
///   instead of hanging a request.
/// - The password never appears in a message or a log line: errors name `description` (the URL redacted).
final class PostgresDialect: StoreDialect {
    /// The channel every notification goes on.
    static let channel = "ils_changes"
    /// A call that has not finished after this long fails with `.unavailable`.
    static let callTimeout: Duration = .seconds(10)
    private static let quiet = Logger(label: "ils.store", factory: { _ in SwiftLogNoOpLogHandler() })

    private let client: PostgresClient
    private let running: Task<Void, Never>
    private let logger: Logger
    private let feedProbe: ChangeFeedProbe
    let description: String

    /// Connects to `url` and brings the schema up to date. Two controllers starting at once migrate one after the
    /// other (a transaction-scoped advisory lock); a schema newer than this build knows is refused.
    init(url: String, logger: Logger, feedProbe: ChangeFeedProbe) async throws(ILSError) {
        let configuration = try PostgresConfiguration(url: url)
        description = configuration.description
        self.logger = logger
        self.feedProbe = feedProbe
        let client = PostgresClient(configuration: configuration.client, backgroundLogger: logger)
        self.client = client
        running = Task { await client.run() }
        do throws(ILSError) {
            try await migrate()
        } catch {
            running.cancel()
            _ = await running.value
            throw error
        }
    }

    deinit {
        running.cancel()
    }

    func close() async {
        running.cancel()
        _ = await running.value
    }

    // MARK: - Transactions

    func transaction<T: Sendable>(
        _ kind: TransactionKind,
        _ body: @escaping @Sendable (any StoreTransaction) async throws(ILSError) -> T
    ) async throws(ILSError) -> T {
        let client = self.client
        let logger = self.logger
        let description = self.description
        return try await bounded {
            switch kind {
            case .read:
                return try await client.withConnection {
                    try await body(PostgresTransaction(connection: $0, description: description))
                }
            case .snapshot:
                return try await client.withTransaction(logger: logger) { connection in
                    // The first statement of the transaction, as PostgreSQL requires.
                    try await connection.query(
                        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY",
                        logger: Self.quiet
                    )
                    return try await body(PostgresTransaction(connection: connection, description: description))
                }
            case .write:
                return try await client.withTransaction(logger: logger) {
                    try await body(PostgresTransaction(connection: $0, description: description))
                }
            }
        }
    }

    private func bounded<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws(ILSError) -> T {
        let description = self.description
        do {
            return try await withThrowingTaskGroup(of: T?.self) { group in
                group.addTask { try await body() }
                group.addTask {
                    try await Task.sleep(for: Self.callTimeout)
                    return nil
                }
                defer { group.cancelAll() }
                guard let first = try await group.next(), let value = first else {
                    throw ILSError(.unavailable, "the store \(description) did not answer in time")
                }
                return value
            }
        } catch let error as ILSError {
            throw error
        } catch let error as PSQLError {
            throw Self.translate(error, description: description)
        } catch {
            // A transaction's closure rethrows our own errors wrapped by postgres-nio.
            if let wrapped = (error as? PostgresTransactionError)?.closureError as? ILSError { throw wrapped }
            if let psql = (error as? PostgresTransactionError)?.closureError as? PSQLError {
                throw Self.translate(psql, description: description)
            }
            if let failure = error as? PostgresTransactionError,
                let psql = (failure.beginError ?? failure.commitError) as? PSQLError
            {
                throw Self.translate(psql, description: description)
            }
            throw ILSError(.unavailable, "the store \(description) failed", detail: "\(type(of: error))")
        }
    }

    /// A server's refusal by SQLSTATE; anything else means the store could not be reached.
    static func translate(_ error: PSQLError, description: String) -> ILSError {
        if let state = error.serverInfo?[.sqlState] {
            switch state {
            case "23505": return ILSError(.conflict, "that would duplicate an entry")
            case "57014": return ILSError(.unavailable, "the store \(description) did not answer in time")
            default:
                let message = error.serverInfo?[.message] ?? ""
                return ILSError(
                    .internalError,
                    "the identity store failed (SQLSTATE \(state))",
                    detail: ControlCharacters.bounded(message, limit: 300)
                )
            }
        }
        return ILSError(.unavailable, "the store \(description) cannot be reached", detail: "\(error.code)")
    }

    // MARK: - Schema

    /// `ils_schema.version` counts PostgreSQL's own steps, which began with the shared list's first three in one.
    static func sharedVersion(stored: Int) -> Int { stored == 0 ? 0 : stored + 2 }
    static func storedVersion(shared: Int) -> Int { shared == 0 ? 0 : shared - 2 }

    private func migrate() async throws(ILSError) {
        let description = self.description
        try await transaction(.write) { tx throws(ILSError) in
            let migrations = StoreSchema.migrations(.postgres)
            _ = try await tx.query("SELECT pg_advisory_xact_lock(7305125)")
            try await tx.execute("CREATE TABLE IF NOT EXISTS ils_schema (version INTEGER NOT NULL)")
            let stored = try await tx.query("SELECT version FROM ils_schema").first?.first?.integer.map(Int.init)
            let version = Self.sharedVersion(stored: stored ?? 0)
            guard version <= migrations.count else {
                throw ILSError(
                    .invalidInput,
                    "the store \(description) was written by a newer ils-gateway (schema \(stored ?? 0)); upgrade first"
                )
            }
            for migration in migrations.dropFirst(version) {
                for statement in migration { try await tx.execute(StoreSQL(stringLiteral: statement)) }
            }
            let latest = Int64(Self.storedVersion(shared: migrations.count))
            if stored == nil {
                try await tx.execute("INSERT INTO ils_schema (version) VALUES (?)", [.integer(latest)])
            } else {
                try await tx.execute("UPDATE ils_schema SET version = ?", [.integer(latest)])
            }
        }
    }

    // MARK: - Change feed

    /// Notifications from every controller's commits. Listens on one connection of the pool; when that connection
    /// is lost, or stops hearing the feed's own probes (`ChangeFeedProbe`), it listens again as soon as the server
    /// answers, and then yields `.resynchronize`, since anything committed meanwhile was not heard.
    func changes() -> AsyncStream<StoreChange> {
        let feed = PostgresChangeFeed(
            client: client,
            logger: logger,
            description: description,
            probe: feedProbe,
            ping: { [weak self] payload throws(ILSError) in
                guard let self else { throw ILSError(.unavailable, "the store is closed") }
                try await self.transaction(.write) { tx throws(ILSError) in
                    _ = try await tx.query("SELECT pg_notify(?, ?)", [.text(Self.channel), .text(payload)])
                }
            }
        )
        return AsyncStream(bufferingPolicy: .bufferingNewest(1024)) { continuation in
            let listener = Task { await feed.run(into: continuation) }
            continuation.onTermination = { _ in listener.cancel() }
        }
    }
}

/// The statements of one PostgreSQL transaction (or, for a read, of one pooled connection).
struct PostgresTransaction: StoreTransaction {
    let connection: PostgresConnection
    /// The store's redacted URL, for messages.
    let description: String
    private static let quiet = Logger(label: "ils.store", factory: { _ in SwiftLogNoOpLogHandler() })

    func query(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> [[StoreValue]] {
        try await run(sql, binds).rows.map { row in row.map(Self.value) }
    }

    func execute(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> Int {
        try await run(sql, binds).metadata.rows ?? 0
    }

    var lockClause: StoreSQL { " FOR UPDATE" }
    /// The database's collation may be a language's (Debian's default is en_US.UTF-8), and SQLite's is bytes.
    var byteOrder: StoreSQL { " COLLATE \"C\"" }

    func lockTable(_ table: StoreSQL) async throws(ILSError) {
        try await execute("LOCK TABLE \(table) IN EXCLUSIVE MODE")
    }

    func notify(_ change: StoreChange) async throws(ILSError) {
        _ = try await query("SELECT pg_notify(?, ?)", [.text(PostgresDialect.channel), .text(change.payload)])
    }

    func auditSequenceFollowsImport() async throws(ILSError) {
        _ = try await query("SELECT setval(pg_get_serial_sequence('audit', 'seq'), (SELECT MAX(seq) FROM audit))")
    }

    /// `sql` with its `?` numbered `$1`, `$2`… as PostgreSQL wants them (the rules' statements hold no `?` in a
    /// literal), run to its end: the rows and the command tag's row count. The future API is the one that gives both.
    private func run(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> PostgresQueryResult {
        var text = ""
        var number = 0
        for character in sql.text {
            if character == "?" {
                number += 1
                text += "$\(number)"
            } else {
                text.append(character)
            }
        }
        precondition(number == binds.count, "\(number) placeholders for \(binds.count) values")
        var bindings = PostgresBindings(capacity: binds.count)
        for bind in binds {
            switch bind {
            case .integer(let value): bindings.append(value)
            case .text(let value): bindings.append(value)
            case .null: bindings.appendNull()
            }
        }
        do {
            return try await connection.query(PostgresQuery(unsafeSQL: text, binds: bindings), logger: Self.quiet)
                .get()
        } catch let error as PSQLError {
            throw PostgresDialect.translate(error, description: description)
        } catch {
            throw ILSError(.unavailable, "the store \(description) failed", detail: "\(type(of: error))")
        }
    }

    /// A cell as the rules read it: integers and booleans as `.integer`, SQL NULL as `.null`, anything else as text.
    private static func value(_ cell: PostgresCell) -> StoreValue {
        guard cell.bytes != nil else { return .null }
        switch cell.dataType {
        case .int8: return (try? cell.decode(Int64.self)).map(StoreValue.integer) ?? .null
        case .int4: return (try? cell.decode(Int32.self)).map { .integer(Int64($0)) } ?? .null
        case .int2: return (try? cell.decode(Int16.self)).map { .integer(Int64($0)) } ?? .null
        case .bool: return (try? cell.decode(Bool.self)).map { .integer($0 ? 1 : 0) } ?? .null
        default: return (try? cell.decode(String.self)).map(StoreValue.text) ?? .null
        }
    }
}
