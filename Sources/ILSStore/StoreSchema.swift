/// The column types that differ between backends; everything else in the schema is written once.
package struct SchemaFlavor: Sendable {
    /// A 64-bit integer column.
    let integer: String
    /// The audit log's key, numbered by the database.
    let serialKey: String

    package static let sqlite = SchemaFlavor(integer: "INTEGER", serialKey: "INTEGER PRIMARY KEY AUTOINCREMENT")
    package static let postgres = SchemaFlavor(integer: "BIGINT", serialKey: "BIGSERIAL PRIMARY KEY")
}

/// The one list of schema versions. Each entry upgrades the schema by one version; never edit a shipped entry. The
/// numbers are SQLite's `user_version`; PostgreSQL's dialect maps them to what its `ils_schema` has always stored.
package enum StoreSchema {
    package static func migrations(_ t: SchemaFlavor) -> [[String]] {
        [
            [
                """
                CREATE TABLE identities (
                    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, role TEXT NOT NULL, attributes TEXT NOT NULL,
                    state TEXT NOT NULL, created_at \(t.integer) NOT NULL, cert_fingerprint TEXT,
                    cert_not_after \(t.integer), public_key TEXT, last_seen_at \(t.integer))
                """,
                """
                CREATE TABLE enrollment_tokens (
                    jti TEXT PRIMARY KEY, identity_id TEXT NOT NULL REFERENCES identities(id) ON DELETE CASCADE,
                    created_at \(t.integer) NOT NULL, expires_at \(t.integer) NOT NULL, consumed_at \(t.integer))
                """,
                "CREATE INDEX enrollment_tokens_identity ON enrollment_tokens(identity_id)",
                """
                CREATE TABLE services (
                    name TEXT PRIMARY KEY, dial_roles TEXT NOT NULL, bind_roles TEXT NOT NULL,
                    created_at \(t.integer) NOT NULL)
                """,
                """
                CREATE TABLE audit (
                    seq \(t.serialKey), at \(t.integer) NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
                    target TEXT NOT NULL, detail TEXT NOT NULL)
                """,
            ],
            // Retention deletes by age; without an index on `at` each pass would scan the whole log.
            ["CREATE INDEX audit_at ON audit(at)"],
            [
                """
                CREATE TABLE controllers (
                    address TEXT PRIMARY KEY, started_at \(t.integer) NOT NULL, last_seen_at \(t.integer) NOT NULL)
                """
            ],
            // Services and policies: the policies as JSON (NULL in a row an earlier release wrote, which then means
            // its roles columns, still written for a replica of that release) and a revision for updates.
            [
                "ALTER TABLE services ADD COLUMN dial_policy TEXT",
                "ALTER TABLE services ADD COLUMN bind_policy TEXT",
                "ALTER TABLE services ADD COLUMN revision \(t.integer) NOT NULL DEFAULT 1",
            ],
        ]
    }
}
