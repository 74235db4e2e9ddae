import ILSObservability
import Logging

#if canImport(Glibc)
import Glibc
#endif

/// Writes one line per log event to stderr, as `text` for people or `json` for collectors.
///
/// Callers never put secrets in messages or metadata (no bodies, no query strings, no tokens, no keys); this handler
/// adds nothing but time, level and label.
///
/// It runs once per proxied request (the access log), so it builds each line in one byte buffer and formats the UTC
/// timestamp by hand (Foundation's date formatting and JSON serialisation cost more than the proxying itself), and
/// hands the line to `LogWriter`, which writes an event loop's lines below warning once per loop turn.
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
        let merged: Logger.Metadata
        if metadata.isEmpty {
            merged = event.metadata ?? [:]
        } else {
            merged = metadata.merging(event.metadata ?? [:]) { _, new in new }
        }
        var line: [UInt8] = []
        line.reserveCapacity(256)
        switch format {
        case .text:
            Self.appendTimestamp(to: &line)
            line.append(contentsOf: " \(event.level) \(label): \(event.message)".utf8)
            for (key, value) in merged.sorted(by: { $0.key < $1.key }) {
                line.append(UInt8(ascii: " "))
                line.append(contentsOf: key.utf8)
                line.append(UInt8(ascii: "="))
                Self.appendQuotedIfNeeded(value.description, to: &line)
            }
        case .json:
            line.append(contentsOf: #"{"ts":""#.utf8)
            Self.appendTimestamp(to: &line)
            var fields: [(String, String)] = [
                ("level", "\(event.level)"), ("logger", label), ("msg", "\(event.message)"),
            ]
            for (key, value) in merged.sorted(by: { $0.key < $1.key })
            where key != "ts" && key != "level" && key != "logger" && key != "msg" {
                fields.append((key, value.description))
            }
            line.append(UInt8(ascii: "\""))
            for (key, value) in fields {
                line.append(UInt8(ascii: ","))
                Self.appendJSONString(key, to: &line)
                line.append(UInt8(ascii: ":"))
                Self.appendJSONString(value, to: &line)
            }
            line.append(UInt8(ascii: "}"))
        }
        line.append(UInt8(ascii: "\n"))
        LogWriter.standardError.write(line, deferrable: event.level < .warning)
    }

    /// `YYYY-MM-DDTHH:MM:SS.mmm` in UTC.
    static func appendTimestamp(to line: inout [UInt8]) {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        var seconds = now.tv_sec
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func digits(_ value: Int, _ count: Int) {
            var divisor = 1
            for _ in 1..<count { divisor *= 10 }
            var rest = value
            while divisor > 0 {
                line.append(UInt8(ascii: "0") + UInt8(rest / divisor % 10))
                rest %= divisor
                divisor /= 10
            }
        }
        digits(Int(parts.tm_year) + 1900, 4)
        line.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mon) + 1, 2)
        line.append(UInt8(ascii: "-"))
        digits(Int(parts.tm_mday), 2)
        line.append(UInt8(ascii: "T"))
        digits(Int(parts.tm_hour), 2)
        line.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_min), 2)
        line.append(UInt8(ascii: ":"))
        digits(Int(parts.tm_sec), 2)
        line.append(UInt8(ascii: "."))
        digits(Int(now.tv_nsec) / 1_000_000, 3)
    }

    /// A text-format value: as is, or in double quotes (with `"` and `\` escaped) when it is empty or holds a space,
    /// a quote, `=` or a control character, so one line always parses back into the same fields.
    static func appendQuotedIfNeeded(_ value: String, to line: inout [UInt8]) {
        let needsQuotes =
            value.isEmpty
            || value.utf8.contains {
                $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\"") || $0 == UInt8(ascii: "=") || $0 < 0x20
            }
        guard needsQuotes else {
            line.append(contentsOf: value.utf8)
            return
        }
        line.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""), UInt8(ascii: "\\"):
                line.append(UInt8(ascii: "\\"))
                line.append(byte)
            case 0x0A: line.append(contentsOf: #"\n"#.utf8)
            case ..<0x20: line.append(UInt8(ascii: "?"))
            default: line.append(byte)
            }
        }
        line.append(UInt8(ascii: "\""))
    }

    /// A JSON string literal (RFC 8259 §7).
    static func appendJSONString(_ value: String, to line: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        line.append(UInt8(ascii: "\""))
        for byte in value.utf8 {
            switch byte {
            case UInt8(ascii: "\""): line.append(contentsOf: #"\""#.utf8)
            case UInt8(ascii: "\\"): line.append(contentsOf: #"\\"#.utf8)
            case 0x0A: line.append(contentsOf: #"\n"#.utf8)
            case 0x0D: line.append(contentsOf: #"\r"#.utf8)
            case 0x09: line.append(contentsOf: #"\t"#.utf8)
            case ..<0x20:
                line.append(contentsOf: #"\u00"#.utf8)
                line.append(hex[Int(byte >> 4)])
                line.append(hex[Int(byte & 0xF)])
            default: line.append(byte)
            }
        }
        line.append(UInt8(ascii: "\""))
    }
}
