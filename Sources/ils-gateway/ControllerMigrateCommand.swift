import ArgumentParser
import Foundation
import ILSCore
import ILSStore
import ILSStorePostgres
import Logging

extension ControllerCommand {
    /// `ils-gateway controller migrate`: a SQLite store copied into an empty PostgreSQL database.
    struct Migrate: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            commandName: "migrate",
            abstract: "Copy a controller's store into an empty one: SQLite to PostgreSQL, before adding replicas.",
            discussion: """
                Copies every identity (with its certificate binding and public key), every token (outstanding and \\
                used), every service and every audit row (with its number and time), then checks that the target \\
                holds the same. A target that already has identities is refused and nothing is written. Stop the \\
                controller first, so nothing changes during the copy; then run it with --store pointing at the new \\
                store. The source is never changed.

                Example:
                  ils-gateway controller migrate --from /var/lib/ils-controller/state/store.sqlite \\
                      --to postgres://ils@db.internal:5432/ils?sslmode=verify-full
                """
        )

        @Option(help: "The store to copy: a SQLite file (or a postgres:// URL).")
        var from: String

        @Option(help: "The empty store to copy into: a postgres:// URL (the password may come from PGPASSWORD).")
        var to: String

        func run() async throws {
            let logger = Logger(label: "ils-migrate", factory: { _ in SwiftLogNoOpLogHandler() })
            let sourceLocation = try StoreLocation(parsing: from)
            let targetLocation = try StoreLocation(parsing: to)
            guard sourceLocation != targetLocation else {
                throw ILSError(.invalidArgument, "--from and --to name the same store")
            }
            if case .sqlite(let path) = sourceLocation, !FileManager.default.fileExists(atPath: path) {
                throw ILSError(.notFound, "there is no store at \(path)")
            }
            let source = try await StoreOpener.open(sourceLocation, logger: logger)
            let target = try await StoreOpener.open(targetLocation, logger: logger)
            defer {
                Task {
                    await source.close()
                    await target.close()
                }
            }
            let summary = try await StoreMigration.copy(from: source, to: target) { copied in
                if copied % 10_000 == 0 { print("audit rows copied: \(copied)") }
            }
            print("copied \(sourceLocation.description) to \(targetLocation.description) and checked it:")
            print("  identities \(summary.identities), tokens \(summary.tokens), services \(summary.services)")
            print("  audit rows \(summary.auditRows) (newest #\(summary.newestAuditSeq))")
            print("next: ils-gateway controller run --state-dir DIR --store '\(targetLocation.description)'")
        }
    }
}
