public import ILSCore

/// Where a controller's store is, as `--store` / `ILS_STORE` give it: a SQLite file (the default, in the state
/// directory) or a PostgreSQL URL several replicas share.
public enum StoreLocation: Sendable, Equatable {
    case sqlite(path: String)
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|require|verify-full]`, or a Unix socket
    /// as libpq writes it: `postgres://USER@/DATABASE?host=/run/postgresql` (the directory holding `.s.PGSQL.PORT`).
    case postgres(url: String)

    /// A `postgres://` or `postgresql://` URL, else a SQLite path.
    public init(parsing text: String) throws(ILSError) {
        guard !text.isEmpty else { throw ILSError(.invalidArgument, "the store location is empty") }
        if text.hasPrefix("postgres://") || text.hasPrefix("postgresql://") {
            self = .postgres(url: text)
        } else if text.contains("://") {
            throw ILSError(
                .invalidArgument,
                "a store is a SQLite file path or a postgres:// URL, not '\(ControlCharacters.bounded(Self.redacted(text), limit: 200))'"
            )
        } else {
            self = .sqlite(path: text)
        }
    }

    /// The location without a password, for logs and messages.
    public var description: String {
        switch self {
        case .sqlite(let path): return path
        case .postgres(let url): return Self.redacted(url)
        }
    }

    /// `scheme://user:secret@host` → `scheme://user:***@host`.
    public static func redacted(_ url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        let rest = url[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        guard let at = rest[..<authorityEnd].lastIndex(of: "@") else { return url }
        let userInfo = rest[..<at]
        guard let colon = userInfo.firstIndex(of: ":") else { return url }
        return String(url[..<schemeEnd.upperBound]) + userInfo[..<colon] + ":***" + rest[at...]
    }
}
