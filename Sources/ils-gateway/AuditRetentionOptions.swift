import ArgumentParser
import ILSConfig
import ILSController
import ILSCore

/// `--audit-retention` and `--audit-max-rows` of `controller run`: how much audit log the store keeps.
struct AuditRetentionOptions: ParsableArguments {
    @Option(help: "Delete audit entries older than this, e.g. 30d, 90d. Default: 90d.")
    var auditRetention: String?

    @Option(help: "Keep at most this many audit entries (the oldest go first). Default: 1000000.")
    var auditMaxRows: Int?

    func retention(_ layers: ConfigLayers) throws(ILSError) -> StoreMaintenance.Retention {
        let standard = StoreMaintenance.Retention.standard
        var age = standard.maximumAge
        if let text = layers.string(.auditRetention, flag: auditRetention) {
            age = try TimeSpan(parsing: text)
            guard age.nanoseconds >= 3_600_000_000_000 else {
                throw ILSError(.invalidArgument, "--audit-retention must be at least 1h, not '\(text)'")
            }
        }
        let rows = layers.integer(.auditMaxRows, flag: auditMaxRows) ?? standard.maximumRows
        guard rows >= 1000 else {
            throw ILSError(.invalidArgument, "--audit-max-rows must be at least 1000, not \(rows)")
        }
        return StoreMaintenance.Retention(maximumAge: age, maximumRows: rows)
    }
}
