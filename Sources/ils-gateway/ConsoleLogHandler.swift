import ILSObservability
import ILSProxy
import Logging

/// Writes one line per log event to stderr, as `text` for people or `json` for collectors (`LogLine`), through
/// `LogWriter`, which writes an event loop's lines below warning once per loop turn.
///
/// Callers never put secrets in messages or metadata (no bodies, no query strings, no tokens, no keys); this handler
/// adds nothing but time, level and label.
struct ConsoleLogHandler: LogHandler {
    let label: String
    let format: LogLineFormat
    var logLevel: Logger.Level = .info
    var metadata: Logger.Metadata = [:]

    init(label: String, format: LogLineFormat) {
        self.label = label
        self.format = format
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    func log(event: LogEvent) {
        let merged: Logger.Metadata
        if metadata.isEmpty {
            merged = event.metadata ?? [:]
        } else {
            merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        }
        let fields = merged.sorted { $0.key < $1.key }.map { (key: $0.key, value: $0.value.description) }
        let line = LogLine.encode(
            format: format,
            level: "\(event.level)",
            label: label,
            message: "\(event.message)",
            fields: fields
        )
        LogWriter.standardError.write(line, deferrable: event.level < .warning)
    }
}

/// Access lines written straight to stderr in the console handler's format, without swift-log's metadata
/// dictionary: building, merging and sorting that dictionary was most of the cost of an access line, itself ~9 % of
/// the HTTP-mode gateway's CPU per request.
struct ConsoleAccessLog: AccessLogSink {
    let label: String
    let format: LogLineFormat

    func record(_ fields: [(key: String, value: String)]) {
        let line = LogLine.encode(format: format, level: "info", label: label, message: "access", fields: fields)
        LogWriter.standardError.write(line, deferrable: true)
    }
}
