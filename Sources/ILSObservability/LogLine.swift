#if canImport(Glibc)
public import Glibc
#endif

/// How a log line is written: `text` for people, `json` for log collectors (one object per line).
public enum LogLineFormat: String, Sendable, CaseIterable {
    case text
    case json
}

/// Builds one log line, the same way for every line the binary writes: the console log handler's lines and the
/// access lines that skip swift-log (see `ILSProxy.AccessLogSink`).
///
/// text: `2026-11-24T05:30:00.123 info ils-gateway: access bytes_in=0 … status=200`; a value is quoted (with `"` and
/// `\` escaped) when it is empty or holds a space, a quote, `=` or a control character, so a line always parses back
/// into the same fields. json: `{"ts":"…","level":"info","logger":"ils-gateway","msg":"access","bytes_in":"0",…}`;
/// a field named `ts`, `level`, `logger` or `msg` is dropped rather than allowed to shadow those. Callers never put
/// secrets in messages or fields; this adds nothing but time, level and label.
///
/// Built in one byte array with the UTC timestamp formatted by hand: Foundation's date formatting and JSON
/// serialisation cost more than proxying the request the line is about.
public enum LogLine {
    /// The line for `message` with `fields` in the order given (callers pass them sorted by key), ending in a newline.
    /// `fields` is an array, not any sequence: a generic sequence from another module is iterated unspecialized, and
    /// that allocated once per field, six times per access line.
    public static func encode(
        format: LogLineFormat,
        level: String,
        label: String,
        message: String,
        fields: [(key: String, value: String)],
        time: timespec = now()
    ) -> [UInt8] {
        var line: [UInt8] = []
        line.reserveCapacity(256)
        switch format {
        case .text:
            appendTimestamp(time, to: &line)
            line.append(UInt8(ascii: " "))
            line.append(contentsOf: level.utf8)
            line.append(UInt8(ascii: " "))
            line.append(contentsOf: label.utf8)
            line.append(contentsOf: ": ".utf8)
            line.append(contentsOf: message.utf8)
            for (key, value) in fields {
                line.append(UInt8(ascii: " "))
                line.append(contentsOf: key.utf8)
                line.append(UInt8(ascii: "="))
                appendQuotedIfNeeded(value, to: &line)
            }
        case .json:
            line.append(contentsOf: #"{"ts":""#.utf8)
            appendTimestamp(time, to: &line)
            line.append(UInt8(ascii: "\""))
            for (key, value) in [("level", level), ("logger", label), ("msg", message)] {
                appendJSONField(key, value, to: &line)
            }
            for (key, value) in fields where !reservedJSONKeys.contains(key) {
                appendJSONField(key, value, to: &line)
            }
            line.append(UInt8(ascii: "}"))
        }
        line.append(UInt8(ascii: "\n"))
        return line
    }

    /// The wall-clock time now.
    public static func now() -> timespec {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return time
    }

    static let reservedJSONKeys: Set<String> = ["ts", "level", "logger", "msg"]

    /// `YYYY-MM-DDTHH:MM:SS.mmm` in UTC.
    static func appendTimestamp(_ time: timespec, to line: inout [UInt8]) {
        var seconds = time.tv_sec
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
        digits(Int(time.tv_nsec) / 1_000_000, 3)
    }

    /// A text-format value: as is, or in double quotes when it needs them (see the type's comment).
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

    /// `,"key":"value"`.
    private static func appendJSONField(_ key: String, _ value: String, to line: inout [UInt8]) {
        line.append(UInt8(ascii: ","))
        appendJSONString(key, to: &line)
        line.append(UInt8(ascii: ":"))
        appendJSONString(value, to: &line)
    }

    /// A JSON string literal (RFC 8259 §7).
    static func appendJSONString(_ value: String, to line: inout [UInt8]) {
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
                line.append(hexDigits[Int(byte >> 4)])
                line.append(hexDigits[Int(byte & 0xF)])
            default: line.append(byte)
            }
        }
        line.append(UInt8(ascii: "\""))
    }

    private static let hexDigits = Array("0123456789abcdef".utf8)
}
