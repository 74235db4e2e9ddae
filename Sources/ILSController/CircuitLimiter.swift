import ILSCore
import ILSFabric
import NIOConcurrencyHelpers
import NIOCore

/// Caps what one enrolled identity may hold and open through this controller's relay, so one device cannot deny the
/// overlay to every other: the circuits it holds at once (across all its connections to this controller), and how
/// fast it opens new ones (a token bucket: `opensPerSecond` sustained, `burst` at once).
///
/// A third review opened and held 16,000 circuits from one device: another device's `/health` failed 12 times in 18,
/// the gateway links were dropped as silent, and the controller wrote 11,021 log lines. The defaults are far above
/// what an app or a tunnel does (a browser behind a tunnel opens 6 connections per host; the app a few streams) and
/// far below what hurts the relay. A refused circuit is answered `429` with `circuit_limit` or `circuit_rate` before
/// any gateway is asked (the relay logs it once per identity a minute, `LogTally`). The caps are per controller: with N controllers a device may hold N times as
/// many, each on its own controller.
public final class CircuitLimiter: Sendable {
    public struct Limits: Sendable, Hashable, CustomStringConvertible {
        /// Circuits one identity may hold open at once. Device connections also advertise it as their
        /// `SETTINGS_MAX_CONCURRENT_STREAMS`, so a device's HTTP/2 stack queues beyond it instead of asking.
        public var concurrent: Int
        /// New circuits one identity may open per second, sustained.
        public var opensPerSecond: Int
        /// New circuits one identity may open at once after a quiet spell.
        public var burst: Int

        public init(concurrent: Int, opensPerSecond: Int, burst: Int? = nil) {
            self.concurrent = concurrent
            self.opensPerSecond = opensPerSecond
            self.burst = burst ?? 2 * opensPerSecond
        }

        public static let standard = Limits(concurrent: 256, opensPerSecond: 200)

        public var description: String {
            "\(concurrent) open per identity, \(opensPerSecond) new per second (bursts of \(burst))"
        }
    }

    /// Which cap refused a circuit; the raw value is the refusal code, the metric label and the log's `cap` field.
    enum Cap: String, Sendable {
        case concurrent = "circuit_limit"
        case rate = "circuit_rate"
    }

    enum Admission: Sendable, Equatable {
        case admitted
        case refused(Cap)
    }

    private struct Bucket {
        var open = 0
        var tokens: Double
        var refilled: NIODeadline
    }

    private struct State {
        var buckets: [String: Bucket] = [:]
        /// Circuits released since the limiter was made (what the controller's memory release watches).
        var released = 0
    }

    let limits: Limits
    private let state = NIOLockedValueBox(State())

    init(limits: Limits) {
        self.limits = limits
    }

    /// Counts a new circuit of `identityID` in, or says which cap refuses it. An admitted circuit must be released
    /// exactly once, when its stream closes.
    func admit(identityID: String, now: NIODeadline = .now()) -> Admission {
        state.withLockedValue { state in
            var bucket = state.buckets[identityID] ?? Bucket(tokens: Double(limits.burst), refilled: now)
            bucket.tokens = refilled(bucket, now: now)
            bucket.refilled = now
            defer { state.buckets[identityID] = bucket }
            if bucket.open >= limits.concurrent { return .refused(.concurrent) }
            if bucket.tokens < 1 { return .refused(.rate) }
            bucket.tokens -= 1
            bucket.open += 1
            return .admitted
        }
    }

    /// Counts a circuit admitted for `identityID` out again. An identity with nothing open and a full bucket is
    /// forgotten, so the table holds only identities that are busy or opened circuits lately.
    func release(identityID: String, now: NIODeadline = .now()) {
        state.withLockedValue { state in
            state.released += 1
            guard var bucket = state.buckets[identityID] else { return }
            bucket.open = max(0, bucket.open - 1)
            let forget = bucket.open == 0 && refilled(bucket, now: now) >= Double(limits.burst)
            state.buckets[identityID] = forget ? nil : bucket
        }
    }

    /// Circuits released since the limiter was made.
    var releasedTotal: Int { state.withLockedValue { $0.released } }

    /// The bucket's tokens at `now`: what it held, plus the rate times the time since, at most a burst.
    private func refilled(_ bucket: Bucket, now: NIODeadline) -> Double {
        let elapsed = Double(max(0, (now - bucket.refilled).nanoseconds)) / 1e9
        return min(Double(limits.burst), bucket.tokens + elapsed * Double(limits.opensPerSecond))
    }

    /// Circuits `identityID` holds open now.
    func open(identityID: String) -> Int {
        state.withLockedValue { $0.buckets[identityID]?.open ?? 0 }
    }

    /// The refusal a device is answered with.
    static func decision(_ cap: Cap, limits: Limits) -> CircuitDecision {
        switch cap {
        case .concurrent:
            .refuse(
                status: 429,
                code: cap.rawValue,
                reason: "this identity holds \(limits.concurrent) circuits through this controller, its cap; "
                    + "close some before opening more"
            )
        case .rate:
            .refuse(
                status: 429,
                code: cap.rawValue,
                reason: "this identity opens circuits faster than \(limits.opensPerSecond) a second, its cap; "
                    + "slow down"
            )
        }
    }
}
