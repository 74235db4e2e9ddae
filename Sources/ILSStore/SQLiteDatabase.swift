import CSQLite
import ILSCore
import NIOConcurrencyHelpers

/// SQLite's values are the store's (`ServiceStoreTests` reads rows with this name).
typealias SQLiteValue = StoreValue

/// One SQLite connection in WAL mode. One transaction at a time: `SQLiteDialect`'s gate, or `init` before anyone else
/// holds the connection.
///
/// Small on purpose: prepared statements with bound parameters only (never SQL built from input), explicit
/// transactions, and `PRAGMA user_version` for migrations.
final class SQLiteDatabase: @unchecked Sendable {
    // @unchecked: `handle` is written once, in `init`, and each statement runs while `lock` is held.
    private let lock = NIOLock()
    private var handle: OpaquePointer?
    let path: String

    init(path: String) throws(ILSError) {
        self.path = path
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX
        guard sqlite3_open_v2(path, &db, flags, nil) == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory"
            sqlite3_close(db)
            throw ILSError(.unavailable, "could not open the store \(path): \(message)")
        }
        handle = db
        sqlite3_busy_timeout(db, 5000)
        try execute("PRAGMA journal_mode=WAL")
        try execute("PRAGMA synchronous=FULL")
        try execute("PRAGMA foreign_keys=ON")
    }

    deinit {
        sqlite3_close_v2(handle)
    }

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction: the write lock is taken up front. Only for a caller that has
    /// the connection to itself (the migrations at start).
    @discardableResult
    func transaction<T>(_ body: () throws(ILSError) -> T) throws(ILSError) -> T {
        try execute("BEGIN IMMEDIATE")
        let result: T
        do throws(ILSError) {
            result = try body()
            try execute("COMMIT")
        } catch {
            _ = try? execute("ROLLBACK")
            throw error
        }
        return result
    }

    @discardableResult
    func execute(_ sql: String, _ bindings: [SQLiteValue] = []) throws(ILSError) -> Int {
        try run(sql, bindings).changes
    }

    func query(_ sql: String, _ bindings: [SQLiteValue] = []) throws(ILSError) -> [[SQLiteValue]] {
        try run(sql, bindings).rows
    }

    /// Runs one statement to its end: its rows, and how many rows it changed.
    private func run(_ sql: String, _ bindings: [SQLiteValue]) throws(ILSError) -> (rows: [[SQLiteValue]], changes: Int)
    {
        lock.lock()
        defer { lock.unlock() }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(handle, sql, -1, &statement, nil) == SQLITE_OK else {
            throw storeError("prepare")
        }
        defer { sqlite3_finalize(statement) }
        for (index, value) in bindings.enumerated() {
            let position = Int32(index + 1)
            switch value {
            case .integer(let number): sqlite3_bind_int64(statement, position, number)
            case .text(let text): sqlite3_bind_text(statement, position, text, -1, sqliteTransient)
            case .null: sqlite3_bind_null(statement, position)
            }
        }
        var rows: [[SQLiteValue]] = []
        while true {
            let step = sqlite3_step(statement)
            if step == SQLITE_DONE { break }
            guard step == SQLITE_ROW else {
                // A duplicate key is a conflict, as PostgreSQL's 23505 is; another broken constraint is the input's.
                // SQLITE_CONSTRAINT_UNIQUE (2067) and _PRIMARYKEY (1555), spelled as numbers: the C macros are
                // expressions of other macros.
                switch sqlite3_extended_errcode(handle) {
                case 2067, 1555:
                    throw ILSError(.conflict, "that would duplicate an entry")
                case let code where code & 0xff == SQLITE_CONSTRAINT:
                    throw ILSError(.invalidArgument, "that would break a constraint of the store")
                default: break
                }
                throw storeError("step")
            }
            var row: [SQLiteValue] = []
            for column in 0..<sqlite3_column_count(statement) {
                switch sqlite3_column_type(statement, column) {
                case SQLITE_INTEGER: row.append(.integer(sqlite3_column_int64(statement, column)))
                case SQLITE_NULL: row.append(.null)
                default: row.append(.text(String(cString: sqlite3_column_text(statement, column))))
                }
            }
            rows.append(row)
        }
        return (rows, Int(sqlite3_changes(handle)))
    }

    private func storeError(_ phase: String) -> ILSError {
        let message = String(cString: sqlite3_errmsg(handle))
        return ILSError(.internalError, "the identity store failed (\(phase)): \(message)")
    }
}

/// SQLite's SQLITE_TRANSIENT: copy bound text before the call returns.
private let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
