import NIOConcurrencyHelpers

/// At most one log line per key (a link, a connection) per interval: the first event of an interval is logged at
/// once, the others only counted, and the next line carries the count since the previous one. For events a peer can
/// cause as fast as it likes (a gateway that does not take circuits, streams reset before an answer), where a line
/// each was a flood of lines and of journald's disk writes. Here, in ILSFabric, for the controller and the gateway
/// alike (the relay's refusals, refused overlay connections, resumptions).
public final class LogTally<Key: Hashable & Sendable>: Sendable {
    private struct Entry {
        var loggedAt: ContinuousClock.Instant
        var since: Int
    }

    /// Keys remembered at most; past it, keys whose interval has passed are forgotten.
    static var rememberedKeys: Int { 4096 }

    private let interval: Duration
    private let entries = NIOLockedValueBox([Key: Entry]())

    public init(interval: Duration) {
        self.interval = interval
    }

    /// An event for `key`: the number of events since the key's previous line (this one included) when a line is due
    /// now, nil when it is only counted.
    public func record(key: Key, now: ContinuousClock.Instant = .now) -> Int? {
        entries.withLockedValue { entries in
            if var entry = entries[key], now < entry.loggedAt + interval {
                entry.since += 1
                entries[key] = entry
                return nil
            }
            let count = (entries[key]?.since ?? 0) + 1
            if entries[key] == nil, entries.count >= Self.rememberedKeys {
                entries = entries.filter { now < $0.value.loggedAt + interval }
            }
            entries[key] = Entry(loggedAt: now, since: 0)
            return count
        }
    }
}
