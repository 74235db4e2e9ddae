import ILSCore
import NIOConcurrencyHelpers
import NIOPosix

#if canImport(Glibc)
import Glibc
#endif

/// SQLite under the store's rules: one connection (`SQLiteDatabase`), one transaction at a time on it.
///
/// The rules are `async` because PostgreSQL is; SQLite's statements are not. A transaction runs on NIO's
/// blocking-I/O pool (a task executor preference), so its statements and the COMMIT's fsync run there without a
/// suspension in between: one hop in and one out per transaction, and no event loop or cooperative thread waits for
/// the disk. sqlite-nio would make each statement a separate hop and bring a second, vendored copy of SQLite, while
/// Debian's libsqlite3 gets the distribution's security fixes; GRDB would add some 40,000 lines for the same thing.
final class SQLiteDialect: StoreDialect {
    let database: SQLiteDatabase
    private let gate = TransactionGate()

    var description: String { database.path }

    /// Opens (creating if needed, 0600) the store at `path` and brings its schema up to date.
    init(path: String) throws(ILSError) {
        if path != SQLiteControllerStore.inMemory { createOwnerOnly(path) }
        database = try SQLiteDatabase(path: path)
        try migrate()
    }

    private func migrate() throws(ILSError) {
        let migrations = StoreSchema.migrations(.sqlite)
        try database.transaction { () throws(ILSError) in
            let version = try database.query("PRAGMA user_version").first?.first?.integer ?? 0
            guard version <= Int64(migrations.count) else {
                throw ILSError(
                    .invalidInput,
                    "the store \(database.path) was written by a newer ils-gateway (schema \(version)); upgrade first"
                )
            }
            for migration in migrations.dropFirst(Int(version)) {
                for statement in migration { try database.execute(statement) }
            }
            try database.execute("PRAGMA user_version = \(migrations.count)")
        }
    }

    func transaction<T: Sendable>(
        _ kind: TransactionKind,
        _ body: @escaping @Sendable (any StoreTransaction) async throws(ILSError) -> T
    ) async throws(ILSError) -> T {
        try await gate.withPermit { () async throws(ILSError) -> T in
            if #available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *) {
                try await withTaskExecutorPreference(BlockingPoolExecutor.shared) { () async throws(ILSError) -> T in
                    try await self.run(kind, body)
                }
            } else {
                // Older Apple systems (development Macs) have no task executors: the transaction runs on the
                // calling task's thread.
                try await run(kind, body)
            }
        }
    }

    private func run<T: Sendable>(
        _ kind: TransactionKind,
        _ body: @Sendable (any StoreTransaction) async throws(ILSError) -> T
    ) async throws(ILSError) -> T {
        let begin: String? =
            switch kind {
            case .read: nil
            // WAL gives the reads one snapshot.
            case .snapshot: "BEGIN"
            // The writer lock up front: of two writers racing on a row, the second sees the first's commit.
            case .write: "BEGIN IMMEDIATE"
            }
        guard let begin else { return try await body(SQLiteTransaction(database: database)) }
        try database.execute(begin)
        do {
            let value = try await body(SQLiteTransaction(database: database))
            try database.execute("COMMIT")
            return value
        } catch {
            _ = try? database.execute("ROLLBACK")
            throw error
        }
    }

    /// One controller per SQLite file: nobody else writes it, so there is nothing to report.
    func changes() -> AsyncStream<StoreChange> {
        AsyncStream { $0.finish() }
    }

    func close() async {}
}

/// Creates the file owner-only before SQLite does (it would use 0644); its -wal and -shm files copy the mode.
private func createOwnerOnly(_ path: String) {
    let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
    if fd >= 0 { close(fd) }
}

/// The statements of one SQLite transaction, run at once on the thread the transaction is on.
struct SQLiteTransaction: StoreTransaction {
    let database: SQLiteDatabase

    func query(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> [[StoreValue]] {
        try database.query(sql.text, binds)
    }

    func execute(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> Int {
        try database.execute(sql.text, binds)
    }

    /// `BEGIN IMMEDIATE` already holds the only writer lock.
    var lockClause: StoreSQL { "" }
    /// SQLite compares text byte by byte (BINARY) unless told otherwise.
    var byteOrder: StoreSQL { "" }
    func lockTable(_ table: StoreSQL) async throws(ILSError) {}
    func notify(_ change: StoreChange) async throws(ILSError) {}
    /// AUTOINCREMENT numbers new rows above the largest `seq` by itself.
    func auditSequenceFollowsImport() async throws(ILSError) {}
}

/// One holder at a time, in arrival order. Written here because the holder awaits its statements, and a lock
/// (`NIOLock`) must not be held across an `await`; neither swift-nio nor the standard library has an async mutex.
final class TransactionGate: Sendable {
    private struct State {
        var held = false
        var waiting: [CheckedContinuation<Void, Never>] = []
    }

    private let state = NIOLockedValueBox(State())

    func withPermit<T>(_ body: () async throws(ILSError) -> T) async throws(ILSError) -> T {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let now = state.withLockedValue { state in
                if state.held {
                    state.waiting.append(continuation)
                    return false
                }
                state.held = true
                return true
            }
            if now { continuation.resume() }
        }
        defer {
            let next = state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
                if state.waiting.isEmpty {
                    state.held = false
                    return nil
                }
                return state.waiting.removeFirst()
            }
            next?.resume()
        }
        return try await body()
    }
}

/// Runs the jobs of tasks that prefer it on NIO's blocking-I/O pool (one per process, a thread per core, never shut
/// down). A pool of the store's own leaked its work queue at exit under LeakSanitizer, as NIO's perpetual pool does.
@available(macOS 15, iOS 18, tvOS 18, watchOS 11, visionOS 2, *)
final class BlockingPoolExecutor: TaskExecutor {
    static let shared = BlockingPoolExecutor()

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        let executor = asUnownedTaskExecutor()
        NIOThreadPool.singleton.submit { _ in job.runSynchronously(on: executor) }
    }
}
