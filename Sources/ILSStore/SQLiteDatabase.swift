import CSQLite
import ILSCore
import NIOConcurrencyHelpers

/// A value bound to or read from a SQLite statement.
enum SQLiteValue: Sendable, Equatable {
    case integer(Int64)
    case text(String)
    case null

    var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }

    var integer: Int64? {
        if case .integer(let value) = self { return value }
        return nil
    }
}

/// One SQLite connection, used by one caller at a time, in WAL mode.
///
/// Small on purpose: prepared statements with bound parameters only (never SQL built from input), explicit
/// transactions, and `PRAGMA user_version` for migrations.
final class SQLiteDatabase: @unchecked Sendable {
    // @unchecked: `handle` is only touched while `lock` is held.
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

    /// Runs `body` with the connection held; nothing else uses it meanwhile.
    func withConnection<T>(_ body: () throws(ILSError) -> T) throws(ILSError) -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body()
    }

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction: the write lock is taken up front, so two controllers (or
    /// two requests) racing on the same row serialise here, and exactly one sees the row unchanged.
    @discardableResult
    func transaction<T>(_ body: () throws(ILSError) -> T) throws(ILSError) -> T {
        try withConnection { () throws(ILSError) -> T in
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
    }

    @discardableResult
    func execute(_ sql: String, _ bindings: [SQLiteValue] = []) throws(ILSError) -> Int {
        _ = try query(sql, bindings)
        return Int(sqlite3_changes(handle))
    }

    func query(_ sql: String, _ bindings: [SQLiteValue] = []) throws(ILSError) -> [[SQLiteValue]] {
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
                if step == SQLITE_CONSTRAINT { throw ILSError(.invalidArgument, "that would duplicate an entry") }
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
        return rows
    }

    private func storeError(_ phase: String) -> ILSError {
        let message = String(cString: sqlite3_errmsg(handle))
        return ILSError(.internalError, "the identity store failed (\(phase)): \(message)")
    }
}

/// SQLite's SQLITE_TRANSIENT: copy bound text before the call returns.
private let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
