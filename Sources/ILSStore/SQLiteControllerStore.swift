public import ILSCore

/// The embedded store for one controller: a SQLite file in WAL mode, `synchronous=FULL`. What it decides is the
/// rules' (`SQLBackedStore`); how it talks to SQLite is `SQLiteDialect`'s.
public final class SQLiteControllerStore: SQLBackedStore {
    /// SQLite's name for a database that is never written to disk.
    public static let inMemory = ":memory:"

    public let backend: StoreBackend
    public let path: String

    /// Opens (creating if needed, 0600) the store at `path` and brings its schema up to date;
    /// `SQLiteControllerStore.inMemory` is a private store that lives as long as this object (tests and fuzzing).
    public init(path: String) throws(ILSError) {
        self.path = path
        backend = StoreBackend(try SQLiteDialect(path: path))
    }

    /// `PRAGMA integrity_check`, for operators and fault tests.
    public func integrityCheck() async throws(ILSError) -> Bool {
        try await backend.run(.read) { tx throws(ILSError) in
            try await tx.query("PRAGMA integrity_check").first?.first?.text == "ok"
        }
    }
}
