public import ILSCore
public import ILSStore
public import Logging

/// The store several controller replicas share: PostgreSQL. What it decides is the rules' (`SQLBackedStore`), the
/// same as SQLite's; how it talks to PostgreSQL, row locks and notifications at commit included, is
/// `PostgresDialect`'s. The contract suite runs on both.
public final class PostgresControllerStore: SQLBackedStore {
    public let backend: StoreBackend
    /// The URL with its password redacted: what messages and logs name.
    public let description: String

    /// Connects to `url` and brings the schema up to date. `feedProbe` sets how soon a change feed that stopped
    /// hearing is noticed.
    public init(url: String, logger: Logger, feedProbe: ChangeFeedProbe = .standard) async throws(ILSError) {
        let dialect = try await PostgresDialect(url: url, logger: logger, feedProbe: feedProbe)
        description = dialect.description
        backend = StoreBackend(dialect)
    }
}
