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
/// any gateway is asked; the first refusal of an identity in a log interval says so in one line, with how many went
/// unlogged since its previous line. The caps are per controller: with N controllers a device may hold N times as
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

    struct Refusal: Sendable, Equatable {
        let cap: Cap
        /// True for the first refusal of an identity in a log interval.
        let logged: Bool
        /// Refusals of this identity that got no line of their own since its previous line.
        let unlogged: Int
    }

    enum Admission: Sendable, Equatable {
        case admitted
        case refused(Refusal)
    }

    private struct Bucket {
        var open = 0
        var tokens: Double
        var refilled: NIODeadline
        var loggedAt: NIODeadline?
        var unlogged = 0
    }

    let limits: Limits
    private let logInterval: TimeAmount
    private let buckets = NIOLockedValueBox([String: Bucket]())

    init(limits: Limits, logInterval: TimeAmount = .seconds(60)) {
        self.limits = limits
        self.logInterval = logInterval
    }

    /// Counts a new circuit of `identityID` in, or says which cap refuses it. An admitted circuit must be released
    /// exactly once, when its stream closes.
    func admit(identityID: String, now: NIODeadline = .now()) -> Admission {
        buckets.withLockedValue { buckets in
            var bucket = buckets[identityID] ?? Bucket(tokens: Double(limits.burst), refilled: now)
            let elapsed = Double(max(0, (now - bucket.refilled).nanoseconds)) / 1e9
            bucket.tokens = min(Double(limits.burst), bucket.tokens + elapsed * Double(limits.opensPerSecond))
            bucket.refilled = now
            let cap: Cap?
            if bucket.open >= limits.concurrent {
                cap = .concurrent
            } else if bucket.tokens < 1 {
                cap = .rate
            } else {
                cap = nil
                bucket.tokens -= 1
                bucket.open += 1
            }
            defer { buckets[identityID] = bucket }
            guard let cap else { return .admitted }
            if let last = bucket.loggedAt, now < last + logInterval {
                bucket.unlogged += 1
                return .refused(Refusal(cap: cap, logged: false, unlogged: 0))
            }
            let unlogged = bucket.unlogged
            bucket.loggedAt = now
            bucket.unlogged = 0
            return .refused(Refusal(cap: cap, logged: true, unlogged: unlogged))
        }
    }

    /// Circuits released since the limiter was made (what the controller's memory release watches).
    var releasedTotal: Int { released.withLockedValue { $0 } }
    private let released = NIOLockedValueBox(0)

    /// Counts a circuit admitted for `identityID` out again. An identity with nothing open and a full bucket is
    /// forgotten, so the table holds only identities that are busy or were refused lately.
    func release(identityID: String, now: NIODeadline = .now()) {
        released.withLockedValue { $0 += 1 }
        buckets.withLockedValue { buckets in
            guard var bucket = buckets[identityID] else { return }
            bucket.open = max(0, bucket.open - 1)
            let elapsed = Double(max(0, (now - bucket.refilled).nanoseconds)) / 1e9
            let full = bucket.tokens + elapsed * Double(limits.opensPerSecond) >= Double(limits.burst)
            let quiet = bucket.loggedAt.map { now >= $0 + logInterval } ?? true
            buckets[identityID] = bucket.open == 0 && full && quiet && bucket.unlogged == 0 ? nil : bucket
        }
    }

    /// Circuits `identityID` holds open now.
    func open(identityID: String) -> Int {
        buckets.withLockedValue { $0[identityID]?.open ?? 0 }
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
