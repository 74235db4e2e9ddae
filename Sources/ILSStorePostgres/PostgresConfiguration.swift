import Foundation
public import ILSCore
import ILSStore
import NIOSSL
import PostgresNIO

/// A `postgres://` URL read into postgres-nio's client configuration, with the bounds every store call gets.
struct PostgresConfiguration: Sendable {
    let client: PostgresClient.Configuration
    /// The URL without its password: what messages and logs name.
    let description: String

    /// A statement the server runs longer than this is cancelled by the server itself (`statement_timeout`).
    static let statementTimeoutMilliseconds = 5_000
    /// A connection attempt gives up after this long.
    static let connectTimeout: Duration = .seconds(5)

    /// Reads `url` (see `StoreLocation.postgres`). The password may also come from `PGPASSWORD`, so it need not be in
    /// a unit file or a process listing.
    init(url: String, environment: [String: String] = ProcessInfo.processInfo.environment) throws(ILSError) {
        let redacted = StoreLocation.redacted(url)
        description = redacted
        func invalid(_ why: String) -> ILSError {
            ILSError(.invalidArgument, "the store URL \(ControlCharacters.bounded(redacted, limit: 200)) \(why)")
        }
        // URLComponents wants a host for "postgres://user@/db"; libpq's socket form has none.
        guard let components = URLComponents(string: url),
            components.scheme == "postgres" || components.scheme == "postgresql"
        else { throw invalid("is not a valid postgres:// URL") }
        let query = Dictionary(
            (components.queryItems ?? []).map { ($0.name, $0.value ?? "") },
            uniquingKeysWith: { $1 }
        )
        let known: Set<String> = ["sslmode", "host", "port", "application_name"]
        if let unknown = query.keys.first(where: { !known.contains($0) }) {
            throw invalid(
                "has a parameter this store does not know: '\(ControlCharacters.bounded(unknown, limit: 40))'"
            )
        }
        guard let user = components.user.flatMap({ $0.removingPercentEncoding }), !user.isEmpty else {
            throw invalid("names no user (postgres://USER@HOST/DATABASE)")
        }
        let password = components.password?.removingPercentEncoding ?? environment["PGPASSWORD"]
        let path = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        guard !path.isEmpty, !path.contains("/") else { throw invalid("names no database (…/DATABASE)") }
        let database = path.removingPercentEncoding ?? path
        let port: Int
        if let text = query["port"] {
            guard let value = Int(text), (1...65535).contains(value) else { throw invalid("has an invalid port") }
            port = value
        } else {
            port = components.port ?? 5432
        }
        var configuration: PostgresClient.Configuration
        if let socketDirectory = query["host"], socketDirectory.hasPrefix("/") {
            configuration = .init(
                unixSocketPath: "\(socketDirectory)/.s.PGSQL.\(port)",
                username: user,
                password: password,
                database: database
            )
        } else {
            guard let host = query["host"] ?? components.host, !host.isEmpty else { throw invalid("names no host") }
            let tls: PostgresClient.Configuration.TLS
            switch query["sslmode"] ?? "prefer" {
            case "disable":
                tls = .disable
            case "prefer":
                tls = .prefer(Self.unverifiedTLS)
            case "require":
                tls = .require(Self.unverifiedTLS)
            case "verify-full":
                tls = .require(.makeClientConfiguration())
            default:
                throw invalid("has an sslmode this store does not know (disable, prefer, require, verify-full)")
            }
            configuration = .init(
                host: host,
                port: port,
                username: user,
                password: password,
                database: database,
                tls: tls
            )
        }
        configuration.options.connectTimeout = Self.connectTimeout
        configuration.options.maximumConnections = 8
        configuration.options.additionalStartupParameters = [
            ("statement_timeout", "\(Self.statementTimeoutMilliseconds)"),
            ("application_name", query["application_name"] ?? "ils-controller"),
        ]
        client = configuration
    }

    /// sslmode=require and prefer, as libpq: encrypted, the server's certificate not checked.
    private static var unverifiedTLS: TLSConfiguration {
        var configuration = TLSConfiguration.makeClientConfiguration()
        configuration.certificateVerification = .none
        return configuration
    }
}
