/// Turns a stream of refusals into a bounded number of records (the controller's audit rows, the tunnel's log lines).
///
/// Anyone who reaches the controller's port can send `POST /v1/enroll` without credentials; one audit row per
/// refusal let 3,000 garbage requests in under 3 s write 3,000 rows and 3 MB of store files. Here the first refusal
/// of a (source, code) pair in a window is written at once (so an admin sees it), and the rest of that window only
/// counts: the count is written as one row when the window ends, or earlier when an admin reads the log
/// (`drain`). Sources beyond `maximumSources` in one window share one key (`otherSources`), so an attacker with many
/// addresses gets no more rows than one with a few. At most `2 × (maximumSources + 1)` rows per code and window.
///
/// A value type that takes events and returns the rows to write (tested without a store); `RefusalAudit` holds it
/// under a lock.
public struct RefusalAggregator: Sendable {
    public struct Key: Hashable, Sendable {
        public var source: String
        public var code: String
    }

    /// An audit row to append: `actor` is the source address, `detail` the refusal code, then ` count=N` when the
    /// row stands for N refusals after the one already written.
    public struct Row: Equatable, Sendable {
        public var actor: String
        public var detail: String

        public init(actor: String, detail: String) {
            self.actor = actor
            self.detail = detail
        }
    }

    public static let otherSources = "other-sources"

    public let window: Int64
    public let maximumSources: Int
    private var windowStart: Int64?
    /// Refusals seen in this window per key, beyond the first one (which was written when it came).
    private var unwritten: [Key: Int] = [:]
    /// The sources with a key of their own in this window.
    private var sources: Set<String> = []

    public init(window: Int64 = 60, maximumSources: Int = 64) {
        self.window = window
        self.maximumSources = maximumSources
    }

    /// A refusal from `source` with `code` at `now` (UNIX seconds): the rows to write now.
    public mutating func record(source: String, code: String, now: Int64) -> [Row] {
        var rows: [Row] = []
        if let start = windowStart, now >= start + window || now < start {
            rows = drain()
            unwritten = [:]
            sources = []
            windowStart = nil
        }
        if windowStart == nil { windowStart = now }
        var key = Key(source: source, code: code)
        if !sources.contains(source) {
            if sources.count < maximumSources { sources.insert(source) } else { key.source = Self.otherSources }
        }
        if let count = unwritten[key] {
            unwritten[key] = count + 1
        } else {
            unwritten[key] = 0
            rows.append(Row(actor: key.source, detail: code))
        }
        return rows
    }

    /// Rows for every count not yet written; the keys stay known, so the window's later refusals still only count.
    public mutating func drain() -> [Row] {
        var rows: [Row] = []
        for (key, count) in unwritten where count > 0 {
            rows.append(Row(actor: key.source, detail: "\(key.code) count=\(count)"))
            unwritten[key] = 0
        }
        return rows.sorted { ($0.actor, $0.detail) < ($1.actor, $1.detail) }
    }
}
