/// A human-written span of time such as `30s`, `15m`, `24h`, `7d` or `250ms`.
///
/// Every duration on the command line and in configuration files is read through this type, so the CLI speaks one
/// dialect everywhere (the CLI contract in ../shared/DESIGN.md).
public struct TimeSpan: Hashable, Sendable, CustomStringConvertible {
    /// The span in nanoseconds; never negative.
    public let nanoseconds: Int64

    public init(nanoseconds: Int64) {
        precondition(nanoseconds >= 0, "a TimeSpan is never negative")
        self.nanoseconds = nanoseconds
    }

    public static func seconds(_ value: Int64) -> TimeSpan { TimeSpan(nanoseconds: value * 1_000_000_000) }
    public static func milliseconds(_ value: Int64) -> TimeSpan { TimeSpan(nanoseconds: value * 1_000_000) }

    /// The units accepted after the number, with their length in nanoseconds.
    private static let units: [(suffix: String, nanoseconds: Int64)] = [
        ("ms", 1_000_000), ("s", 1_000_000_000), ("m", 60_000_000_000),
        ("h", 3_600_000_000_000), ("d", 86_400_000_000_000),
    ]

    /// Parses `<digits><unit>` where unit is one of `ms`, `s`, `m`, `h`, `d`. A bare `0` is accepted; any other
    /// number needs a unit, because `30` could mean seconds to one reader and minutes to another.
    public init(parsing text: String) throws(ILSError) {
        let trimmed = text.trimmingSpaces()
        if trimmed == "0" {
            self.init(nanoseconds: 0)
            return
        }
        let digits = trimmed.prefix { $0.isASCII && $0.isNumber }
        let suffix = trimmed.dropFirst(digits.count)
        guard !digits.isEmpty, digits.count <= 12, let value = Int64(digits),
            let unit = Self.units.first(where: { $0.suffix == suffix })
        else {
            throw ILSError(
                .invalidArgument,
                "'\(text)' is not a duration; write a whole number and a unit, e.g. 500ms, 30s, 15m, 24h or 7d"
            )
        }
        let (product, overflow) = value.multipliedReportingOverflow(by: unit.nanoseconds)
        guard !overflow else { throw ILSError(.invalidArgument, "duration '\(text)' is too large") }
        self.init(nanoseconds: product)
    }

    /// The shortest exact spelling, e.g. `90s` prints as `90s`, `120s` as `2m`.
    public var description: String {
        if nanoseconds == 0 { return "0s" }
        for unit in Self.units.reversed() where nanoseconds % unit.nanoseconds == 0 {
            return "\(nanoseconds / unit.nanoseconds)\(unit.suffix)"
        }
        return "\(nanoseconds)ns"
    }

    public var swiftDuration: Duration { .nanoseconds(nanoseconds) }
}

extension String {
    func trimmingSpaces() -> String {
        var slice = Substring(self)
        while slice.first?.isWhitespace == true { slice = slice.dropFirst() }
        while slice.last?.isWhitespace == true { slice = slice.dropLast() }
        return String(slice)
    }
}
