public import ILSCore
public import ILSStore
public import Logging

/// Opens the store a `--store` value names.
public enum StoreOpener {
    public static func open(_ location: StoreLocation, logger: Logger) async throws(ILSError) -> any ControllerStore {
        switch location {
        case .sqlite(let path):
            return try SQLiteControllerStore(path: path)
        case .postgres(let url):
            return try await PostgresControllerStore(url: url, logger: logger)
        }
    }
}
