import Foundation
import Logging

/// Writes one line per log event to stderr, as `text` for people or `json` for collectors.
///
/// Callers never put secrets in messages or metadata (no bodies, no query strings, no tokens, no keys); this handler
/// adds nothing but time, level and label.
struct ConsoleLogHandler: LogHandler {
    let label: String
    let format: LogOptions.Format
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(label: String, format: LogOptions.Format) {
        self.label = label
        self.format = format
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        var merged = metadata
        if let extra = event.metadata { merged.merge(extra) { _, new in new } }
        let timestamp = Date().formatted(.iso8601.year().month().day().time(includingFractionalSeconds: true))
        let line: String
        switch format {
        case .text:
            var text = "\(timestamp) \(event.level) \(label): \(event.message)"
            for key in merged.keys.sorted() {
                text += " \(key)=\(Self.quoteIfNeeded("\(merged[key]!)"))"
            }
            line = text + "\n"
        case .json:
            var object: [String: String] = [
                "ts": timestamp, "level": "\(event.level)", "logger": label,
                "msg": "\(event.message)",
            ]
            for (key, value) in merged where object[key] == nil { object[key] = "\(value)" }
            let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
            line = String(decoding: data, as: UTF8.self) + "\n"
        }
        writeToStandardError(line)
    }

    private static func quoteIfNeeded(_ value: String) -> String {
        guard value.isEmpty || value.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" }) else { return value }
        return "\"" + value.replacingOccurrences(of: "\"", with: "\\\"") + "\""
    }
}
