public import ILSCore
import NIOConcurrencyHelpers

/// A value bound to or read from a statement. The schema has TEXT and 64-bit INTEGER columns only.
package enum StoreValue: Sendable, Hashable {
    case integer(Int64)
    case text(String)
    case null

    package var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }

    package var integer: Int64? {
        if case .integer(let value) = self { return value }
        return nil
    }

    package static func textOrNull(_ value: String?) -> StoreValue { value.map { .text($0) } ?? .null }
    package static func integerOrNull(_ value: Int64?) -> StoreValue { value.map { .integer($0) } ?? .null }
}

/// Statement text the rules write. Its interpolations can only be other `StoreSQL` (a column list, a dialect's
/// `lockClause`), never a value: whatever a peer sent is bound to a `?`, so nothing from the network is ever spliced
/// into a statement.
package struct StoreSQL: Sendable, ExpressibleByStringInterpolation {
    package let text: String

    package init(stringLiteral value: String) { text = value }

    package init(stringInterpolation: Interpolation) { text = stringInterpolation.text }

    /// `fragment` `count` times, joined by `separator`: a multi-row VALUES list, still made of fragments only.
    package static func repeating(_ fragment: StoreSQL, count: Int, separator: StoreSQL) -> StoreSQL {
        StoreSQL(stringLiteral: Array(repeating: fragment.text, count: count).joined(separator: separator.text))
    }

    package struct Interpolation: StringInterpolationProtocol {
        var text = ""
        package init(literalCapacity: Int, interpolationCount: Int) { text.reserveCapacity(literalCapacity) }
        package mutating func appendLiteral(_ literal: String) { text += literal }
        package mutating func appendInterpolation(_ fragment: StoreSQL) { text += fragment.text }
    }
}

/// How much a transaction must see and hold.
package enum TransactionKind: Sendable {
    /// One statement that reads: no transaction of its own.
    case read
    /// Several reads that must see one moment (an export). PostgreSQL: REPEATABLE READ, read only.
    case snapshot
    /// Checks, then writes. SQLite takes its one writer lock up front (`BEGIN IMMEDIATE`); PostgreSQL runs at READ
    /// COMMITTED and the rules lock the rows they will change (`lockClause`), the identity's row before its tokens'.
    case write
}

/// One open transaction, as the rules see it. Placeholders are `?`, bound in order.
package protocol StoreTransaction: Sendable {
    /// The rows `sql` returns.
    func query(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> [[StoreValue]]
    /// The number of rows `sql` inserted, changed or deleted.
    @discardableResult func execute(_ sql: StoreSQL, _ binds: [StoreValue]) async throws(ILSError) -> Int
    /// Written after a SELECT of rows the transaction will change: " FOR UPDATE" where rows lock, "" where the
    /// transaction already holds the only writer lock.
    var lockClause: StoreSQL { get }
    /// Written after a text column in ORDER BY: byte order on every backend, whatever the database's collation.
    var byteOrder: StoreSQL { get }
    /// Keeps every other writer off `table` until the transaction ends (an import into an empty store).
    func lockTable(_ table: StoreSQL) async throws(ILSError)
    /// Tells the other controllers sharing the store, at commit and never on rollback.
    func notify(_ change: StoreChange) async throws(ILSError)
    /// After audit rows were written with their own `seq`, new rows are numbered above them.
    func auditSequenceFollowsImport() async throws(ILSError)
}

extension StoreTransaction {
    package func query(_ sql: StoreSQL) async throws(ILSError) -> [[StoreValue]] { try await query(sql, []) }
    @discardableResult package func execute(_ sql: StoreSQL) async throws(ILSError) -> Int {
        try await execute(sql, [])
    }
}

/// What differs between the backends: statements, transactions and the change feed. What a store decides is in
/// the rules (`SQLBackedStore`), once.
package protocol StoreDialect: Sendable {
    /// A path or a redacted URL: what messages name. Never a password.
    var description: String { get }
    /// Runs `body` as one transaction of `kind`. A rule's `ILSError` comes out as it was thrown, after a rollback.
    func transaction<T: Sendable>(
        _ kind: TransactionKind,
        _ body: @escaping @Sendable (any StoreTransaction) async throws(ILSError) -> T
    ) async throws(ILSError) -> T
    func changes() -> AsyncStream<StoreChange>
    func close() async
}

/// The dialect a store runs on, and what every backend shares around it: after `close()` every call fails at once.
/// Public only as an opaque box; what is in it is `package`.
public final class StoreBackend: Sendable {
    package let dialect: any StoreDialect
    private let closed = NIOLockedValueBox(false)

    package init(_ dialect: any StoreDialect) { self.dialect = dialect }

    package func run<T: Sendable>(
        _ kind: TransactionKind,
        _ body: @escaping @Sendable (any StoreTransaction) async throws(ILSError) -> T
    ) async throws(ILSError) -> T {
        guard !closed.withLockedValue({ $0 }) else {
            throw ILSError(.unavailable, "the store \(dialect.description) is closed")
        }
        return try await dialect.transaction(kind, body)
    }

    package func close() async {
        closed.withLockedValue { $0 = true }
        await dialect.close()
    }
}

/// A `ControllerStore` whose every decision (refusal order, state transitions, audit rows, revisions, retention,
/// what is announced) is made in this protocol's extensions, once, over a dialect. A backend is a dialect and a
/// class that holds it: `SQLiteControllerStore`, `PostgresControllerStore`.
public protocol SQLBackedStore: ControllerStore {
    var backend: StoreBackend { get }
}

extension SQLBackedStore {
    public func changes() -> AsyncStream<StoreChange> { backend.dialect.changes() }
    public func close() async { await backend.close() }
}

extension StoreChange {
    /// The text of a notification between controllers: `identity:ID`, `services` or `controllers`.
    package var payload: String {
        switch self {
        case .identity(let id): "identity:\(id)"
        case .services: "services"
        case .controllers: "controllers"
        case .resynchronize: "resynchronize"
        }
    }

    /// The change a notification names; nil for anything else, or longer than an id can be.
    package init?(payload: String) {
        guard payload.utf8.count <= 200 else { return nil }
        switch payload {
        case "services": self = .services
        case "controllers": self = .controllers
        default:
            guard payload.hasPrefix("identity:") else { return nil }
            let id = String(payload.dropFirst("identity:".count))
            guard !id.isEmpty else { return nil }
            self = .identity(id: id)
        }
    }
}
