import NIOConcurrencyHelpers
public import NIOCore

/// Caps the connections a listener holds open: per source address and in total.
///
/// Both the controller's port and HTTP mode's listener use it, through `ConnectionLimitHandler` on the listening
/// channel, which asks `admit` for every accepted socket before it is registered with the event loop: a refused
/// socket is closed before any TLS, so a flood of connections costs the server an `accept` and a `close` each.
/// Deadlines bound how long one connection may take; this bounds how many a client may hold at once (400
/// connections that each trickled a byte every 20 s once held 400 descriptors and 23 MB of the controller).
///
/// The source is the peer's IP address. Many clients behind one NAT share one, so the per-source cap is sized for a
/// NAT's worth of clients, not one client. Counting is thread-safe: admissions happen on the listener's event loop,
/// releases on each connection's.
public final class ConnectionLimiter: Sendable {
    /// How many connections may be open at once.
    public struct Limits: Sendable, Hashable, CustomStringConvertible {
        /// All sources together.
        public var total: Int
        /// One source address.
        public var perSource: Int

        public init(total: Int, perSource: Int) {
            self.total = total
            self.perSource = perSource
        }

        public var description: String { "\(total) in total, \(perSource) per source" }
    }

    /// Which cap refused a connection; the raw value is the metric label and the log's `cap` field.
    public enum Cap: String, Sendable {
        case total
        case perSource = "per_source"
    }

    /// A refused connection, and whether it is the one that gets a log line for its source.
    public struct Refusal: Sendable, Equatable {
        public let cap: Cap
        public let source: String
        /// True for the first refusal of a source in a log interval. Refusals come as floods; one line per source
        /// per interval keeps a flood from becoming a flood of log lines (and of journald's disk writes).
        public let logged: Bool
        /// Refusals of this source that got no line of their own since its previous line.
        public let unlogged: Int
    }

    public enum Admission: Sendable, Equatable {
        case admitted
        case refused(Refusal)
    }

    private struct State {
        var total = 0
        var bySource: [String: Int] = [:]
        /// When each source last got a log line, and how many of its refusals went unlogged since.
        var logged: [String: (at: NIODeadline, unlogged: Int)] = [:]
    }

    /// The most sources whose last log line is remembered; beyond it, sources whose interval has passed are
    /// forgotten, and if none has, refusals of new sources go unlogged (they are still counted by the metrics).
    static let rememberedSources = 4096

    public let limits: Limits
    private let logInterval: TimeAmount
    private let state = NIOLockedValueBox(State())

    public init(limits: Limits, logInterval: TimeAmount = .seconds(60)) {
        self.limits = limits
        self.logInterval = logInterval
    }

    /// Connections open now.
    public var openConnections: Int { state.withLockedValue { $0.total } }

    /// Counts a new connection from `source` in, or says which cap refuses it. An admitted connection must be
    /// released exactly once, when it closes.
    public func admit(source: String, now: NIODeadline = .now()) -> Admission {
        state.withLockedValue { state in
            let fromSource = state.bySource[source, default: 0]
            let cap: Cap
            if fromSource >= limits.perSource {
                cap = .perSource
            } else if state.total >= limits.total {
                cap = .total
            } else {
                state.total += 1
                state.bySource[source] = fromSource + 1
                return .admitted
            }
            return .refused(refusal(cap, source: source, now: now, state: &state))
        }
    }

    /// Counts a connection admitted from `source` out again.
    public func release(source: String) {
        state.withLockedValue { state in
            guard let fromSource = state.bySource[source] else { return }
            state.total -= 1
            state.bySource[source] = fromSource > 1 ? fromSource - 1 : nil
        }
    }

    private func refusal(_ cap: Cap, source: String, now: NIODeadline, state: inout State) -> Refusal {
        if let last = state.logged[source], now < last.at + logInterval {
            state.logged[source] = (last.at, last.unlogged + 1)
            return Refusal(cap: cap, source: source, logged: false, unlogged: 0)
        }
        let unlogged = state.logged[source]?.unlogged ?? 0
        if state.logged[source] == nil, state.logged.count >= Self.rememberedSources {
            state.logged = state.logged.filter { now < $0.value.at + logInterval }
            guard state.logged.count < Self.rememberedSources else {
                return Refusal(cap: cap, source: source, logged: false, unlogged: 0)
            }
        }
        state.logged[source] = (now, 0)
        return Refusal(cap: cap, source: source, logged: true, unlogged: unlogged)
    }
}
